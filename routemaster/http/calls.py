"""What one outbound call came to, as the delivery log keeps it (pure).

The URL is kept without its secrets (userinfo and query values redacted),
the answer's body only as a short excerpt, and a failure is told apart by
kind: no answer in time (``timeout``), no answer at all (``network``), an
answer that refuses for good (``gone``, 410), one that asks to slow down
(``throttled``, 429), any other non-2xx (``failed``).
"""

from __future__ import annotations

import datetime
import email.utils
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import requests

from routemaster.http.client import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Answer,
    OutboundError,
    OutboundTimeout,
    send,
)

EXCERPT_BYTES = 1024
REDACTED = "REDACTED"
MAX_RETRY_AFTER = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Call:
    url: str  # redacted
    started_at: datetime.datetime
    duration_ms: int
    status: int | None  # None: no answer
    outcome: str  # delivered, accepted, failed, gone, timeout, network, throttled
    error: str | None
    excerpt: str | None  # the first KiB of the body, as text
    retry_after: datetime.timedelta | None = None  # asked for by a 429 or 503

    @property
    def receiver_failed(self) -> bool:
        """Whether it counts against the receiver's circuit: no answer, 5xx or 429."""
        if self.status is None:
            return self.outcome in ("timeout", "network")
        return self.status >= 500 or self.status == 429

    @property
    def receiver_answered(self) -> bool:
        return self.outcome in ("delivered", "accepted")


def outcome_of(status: int) -> str:
    """The outcome of an answer with ``status`` (2xx: delivered)."""
    if 200 <= status < 300:
        return "delivered"
    if status == 410:
        return "gone"
    if status == 429:
        return "throttled"
    return "failed"


def redact_url(url: str) -> str:
    """``url`` with userinfo and every query value replaced by ``REDACTED``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        query = "&".join(
            f"{quote(key, safe='')}={REDACTED}" if value else quote(key, safe="")
            for key, value in parse_qsl(query, keep_blank_values=True)
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=""))


def excerpt(body: bytes) -> str:
    """The first KiB of a body as text (invalid UTF-8 replaced, NUL dropped)."""
    return body[:EXCERPT_BYTES].decode("utf-8", errors="replace").replace("\0", "")


def retry_after(
    status: int, headers: Mapping[str, str], now: datetime.datetime
) -> datetime.timedelta | None:
    """How long a 429 or 503 asks us to wait (``Retry-After`` seconds or date), at most a day."""
    if status not in (429, 503):
        return None
    text = headers.get("Retry-After")
    if not text:
        return None
    text = text.strip()
    if text.isdigit():
        wait = datetime.timedelta(seconds=int(text[:9]))
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        wait = when - now
    return max(datetime.timedelta(0), min(wait, MAX_RETRY_AFTER))


def send_logged(
    session: requests.Session,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: float,
    started_at: datetime.datetime,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> tuple[Call, Answer | None]:
    """One request (redirects not followed), and the :class:`Call` the delivery log keeps of it.

    Never raises for HTTP trouble: no answer is a ``timeout`` or ``network`` call.
    """
    started = time.monotonic()
    try:
        answer = send(
            session,
            method,
            url,
            headers=headers,
            body=body,
            deadline=started + timeout,
            max_response_bytes=max_response_bytes,
        )
    except OutboundError as failure:
        kind = "timeout" if isinstance(failure, OutboundTimeout) else "network"
        problem = str(failure).replace(url, redact_url(url))
        return Call(redact_url(url), started_at, _ms(started), None, kind, problem, None), None
    outcome = outcome_of(answer.status)
    error = (
        None
        if outcome == "delivered"
        else f"{method} {redact_url(url)} returned status {answer.status}"
    )
    call = Call(
        redact_url(url),
        started_at,
        _ms(started),
        answer.status,
        outcome,
        error,
        excerpt(answer.body),
        retry_after(answer.status, answer.headers, started_at),
    )
    return call, answer


def _ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
