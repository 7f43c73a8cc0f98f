"""Delivering an action's webhook: the request (SPEC A5), signing, and what the answer means."""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests

from routemaster import __version__
from routemaster.config.model import Action, StateMachine
from routemaster.http.headers import headers_for
from routemaster.http.urls import render_url

USER_AGENT = f"routemaster/{__version__}"


class Outcome(enum.Enum):
    DELIVERED = "delivered"  # 2xx: move the label on
    GONE = "gone"  # 410: the receiver refuses for good, mark errored now
    FAILED = "failed"  # anything else: retry with backoff


@dataclass(frozen=True)
class DeliveryResult:
    outcome: Outcome
    url: str
    status: int | None = None  # None when no response came back
    error: str | None = None  # for ``last_error``; None when delivered


@dataclass(frozen=True)
class WebhookRequest:
    url: str
    headers: dict[str, str]
    body: bytes


def build_request(
    machine: StateMachine,
    action: Action,
    label: str,
    metadata: Mapping[str, Any],
    *,
    token: str,
    timestamp: int,
) -> WebhookRequest:
    """The exact request for one delivery attempt of one entry into ``action``.

    ``token`` (the entry's history id) is the same for every retry of that
    entry, so receivers can deduplicate. The protocol headers are applied
    after the configured ``webhooks`` headers so configuration cannot break
    the idempotency token or the signature.
    """
    url = render_url(action.webhook, label=label, state_machine=machine.name)
    body = json.dumps({"label": label, "metadata": metadata}, separators=(",", ":")).encode()
    headers = headers_for(machine, url)
    headers["Content-Type"] = "application/json"
    headers["X-Idempotency-Token"] = token
    if machine.signing_secret is not None:
        headers["webhook-id"] = token
        headers["webhook-timestamp"] = str(timestamp)
        headers["webhook-signature"] = sign(machine.signing_secret, token, timestamp, body)
    return WebhookRequest(url=url, headers=headers, body=body)


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """A Standard Webhooks signature: ``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``.

    A secret written as ``whsec_<base64>`` (the Standard Webhooks form) is
    base64-decoded to get the key, so off-the-shelf verifiers work; any
    other secret is used as its UTF-8 bytes.
    """
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_signing_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def _signing_key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_") :])
    return secret.encode()


def deliver(
    session: requests.Session,
    request: WebhookRequest,
    *,
    timeout: float,
    on_response: Callable[[requests.Response], None] | None = None,
) -> DeliveryResult:
    """POST ``request`` once and classify the answer; never raises for HTTP trouble.

    ``on_response`` is told of the response, if one came (the logging plugins' hook).

    Sent straight through the session's connection pool (its adapter): no
    cookies, no redirects (a 3xx is not a 2xx, so it is retried), none of the
    per-request setting merges that cost a third of a delivery's time.
    """
    try:
        prepared = requests.PreparedRequest()
        prepared.prepare(
            method="POST",
            url=request.url,
            headers={"User-Agent": USER_AGENT, **request.headers},
            data=request.body,
        )
        response = session.get_adapter(request.url).send(prepared, timeout=timeout)
    except requests.RequestException as exc:
        return DeliveryResult(
            Outcome.FAILED,
            request.url,
            error=f"POST {request.url} failed: {type(exc).__name__}: {exc}",
        )
    # Drain the body so the connection goes back to the keep-alive pool.
    response.content  # noqa: B018
    if on_response is not None:
        on_response(response)
    status = response.status_code
    if 200 <= status < 300:
        return DeliveryResult(Outcome.DELIVERED, request.url, status)
    error = f"POST {request.url} returned status {status}"
    if status == 410:
        return DeliveryResult(Outcome.GONE, request.url, status, error)
    return DeliveryResult(Outcome.FAILED, request.url, status, error)
