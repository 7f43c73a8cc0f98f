"""Delivering an action's webhook: the request (SPEC A5), signing, and what the answer means."""

from __future__ import annotations

import base64
import datetime
import enum
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests

from routemaster.config.model import Action, StateMachine
from routemaster.http.calls import Call, excerpt, outcome_of, redact_url, retry_after
from routemaster.http.client import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Answer,
    OutboundError,
    OutboundTimeout,
    send,
)
from routemaster.http.headers import headers_for
from routemaster.http.urls import render_url


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
    call: Call | None = None  # what the delivery log keeps of it


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
    the idempotency token or the signature. The rules are matched against
    the configured URL template, never the URL with the label in it.
    """
    assert action.webhook is not None, "pull actions (worker:) are never delivered"
    url = render_url(action.webhook, label=label, state_machine=machine.name)
    body = json.dumps({"label": label, "metadata": metadata}, separators=(",", ":")).encode()
    headers = headers_for(machine, action.webhook)
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
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    on_response: Callable[[Answer], None] | None = None,
    started_at: datetime.datetime | None = None,
) -> DeliveryResult:
    """POST ``request`` once and classify the answer; never raises for HTTP trouble.

    ``on_response`` is told of the answer, if one came (the logging plugins' hook).

    ``timeout`` is a total deadline (connect, send, status, headers, body).
    The answer's body is read up to ``max_response_bytes`` and then dropped
    with the connection. Redirects are not followed: a 3xx is not a 2xx, so
    it is retried like any other failure, and the headers (secrets) of the
    configured URL never travel to where it points. ``started_at`` (default:
    the system clock) dates the :class:`Call` the result carries.
    """
    started_at = started_at or datetime.datetime.now(datetime.UTC)
    started = time.monotonic()
    try:
        answer = send(
            session,
            "POST",
            request.url,
            headers=request.headers,
            body=request.body,
            deadline=time.monotonic() + timeout,
            max_response_bytes=max_response_bytes,
        )
    except OutboundError as failure:
        kind = "timeout" if isinstance(failure, OutboundTimeout) else "network"
        call = Call(
            redact_url(request.url),
            started_at,
            _ms_since(started),
            None,
            kind,
            str(failure).replace(request.url, redact_url(request.url)),
            None,
        )
        return DeliveryResult(Outcome.FAILED, request.url, error=str(failure), call=call)
    if on_response is not None:
        on_response(answer)
    status = answer.status
    error: str | None = None
    outcome = Outcome.DELIVERED
    if not 200 <= status < 300:
        error = f"POST {request.url} returned status {status}"
        if 300 <= status < 400:
            error += f" (redirects are not followed; Location: {answer.headers.get('Location')})"
        outcome = Outcome.GONE if status == 410 else Outcome.FAILED
    call = Call(
        redact_url(request.url),
        started_at,
        _ms_since(started),
        status,
        outcome_of(status),
        error and error.replace(request.url, redact_url(request.url)),
        excerpt(answer.body),
        retry_after(status, answer.headers, started_at),
    )
    return DeliveryResult(outcome, request.url, status, error, call)


def _ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
