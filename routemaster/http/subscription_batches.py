"""A push subscription's batch: its body, its Standard Webhooks headers, the session it goes by.

The body is ``{"subscription": NAME, "events": [EVENT, ...]}``, written once
when the batch is cut and stored, so a re-send is the same bytes. The
``webhook-id`` is the batch's id (the same for every re-send); the signature
(``webhook-signature``, as for action webhooks: :func:`routemaster.http.webhooks.sign`)
covers id, timestamp and body, and is made at each send with the secret read
then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import requests

from routemaster.http.guard import AddressPolicy, GuardedAdapter
from routemaster.http.webhooks import WebhookRequest, sign


def batch_body(subscription: str, events: Sequence[Mapping[str, Any]]) -> bytes:
    return json.dumps(
        {"subscription": subscription, "events": events},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def batch_request(
    url: str, body: bytes, *, batch_id: str, timestamp: int, secret: str | None
) -> WebhookRequest:
    """The request for one send of a batch; signed when ``secret`` is given."""
    headers = {
        "Content-Type": "application/json",
        "webhook-id": batch_id,
        "webhook-timestamp": str(timestamp),
    }
    if secret is not None:
        headers["webhook-signature"] = sign(secret, batch_id, timestamp, body)
    return WebhookRequest(url=url, headers=headers, body=body)


def subscription_session(policy: AddressPolicy, size: int) -> requests.Session:
    """A keep-alive session whose connections never reach an address the policy refuses."""
    session = requests.Session()
    session.trust_env = False  # no proxies from the environment: connect where the URL says
    adapter = GuardedAdapter(policy, pool_connections=size, pool_maxsize=size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
