"""Fetching a feed for an evaluation: one GET, JSON back, or :class:`FeedUnavailable`."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin

import requests

from routemaster.config.model import StateMachine
from routemaster.exit_conditions.context import FeedUnavailable
from routemaster.http.calls import Call, excerpt, outcome_of, redact_url
from routemaster.http.client import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Answer,
    OutboundError,
    OutboundTimeout,
    send,
)
from routemaster.http.headers import headers_for
from routemaster.http.urls import origin, render_url
from routemaster.limits import DEFAULT_MAX_DEPTH, JSONRejected, parse_json

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 5
_REDIRECTS = {301, 302, 303, 307, 308}

FeedObserver = Callable[[str, int | None, float], None]
"""Told of every fetch: the URL, the status (``None``: no answer) and the seconds it took."""


def fetch_feed(
    session: requests.Session,
    machine: StateMachine,
    feed_name: str,
    label: str,
    *,
    timeout: float,
    observe: FeedObserver | None = None,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    on_response: Callable[[Answer], None] | None = None,
    on_call: Callable[[Call], None] | None = None,
) -> Any:
    """The decoded JSON body of ``feed_name`` for ``label``.

    ``timeout`` is one total deadline for the whole fetch, redirects
    included. Redirects (up to :data:`MAX_REDIRECTS`) are followed; the
    configured headers (the secrets of ``webhooks`` rules) go only to the
    origin of the configured URL, never to another one a redirect names.
    Anything unusable raises :class:`FeedUnavailable` naming the URL and the
    problem, so the evaluation decides nothing and the label stays in its
    gate to be retried: no answer in time, a non-2xx status, a body over
    ``max_response_bytes``, not JSON, or JSON nested deeper than ``max_depth``.
    ``on_response`` is told of the final answer (the logging plugins' hook),
    ``on_call`` of what the fetch came to, for the delivery log.
    """
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.monotonic()
    seen: dict[str, Any] = {}  # what the fetch came to, for on_call
    try:
        value = _fetch(
            session,
            machine,
            feed_name,
            label,
            timeout,
            observe,
            max_response_bytes,
            max_depth,
            on_response,
            seen,
        )
    except FeedUnavailable as failure:
        if on_call is not None:
            on_call(_call(seen, started_at, started, failure.reason))
        raise
    if on_call is not None:
        on_call(_call(seen, started_at, started, None))
    return value


def _call(
    seen: dict[str, Any], started_at: datetime.datetime, started: float, error: str | None
) -> Call:
    answer: Answer | None = seen.get("answer")
    url = redact_url(seen.get("url", ""))
    if error is not None and seen.get("url"):
        error = error.replace(seen["url"], url)
    duration = round((time.monotonic() - started) * 1000)
    if answer is None:
        kind = "timeout" if seen.get("timeout") else "network"
        return Call(url, started_at, duration, None, kind, error, None)
    outcome = outcome_of(answer.status)
    if error is not None and outcome == "delivered":
        outcome = "failed"  # answered, but not with usable JSON
    return Call(url, started_at, duration, answer.status, outcome, error, excerpt(answer.body))


def _fetch(
    session: requests.Session,
    machine: StateMachine,
    feed_name: str,
    label: str,
    timeout: float,
    observe: FeedObserver | None,
    max_response_bytes: int,
    max_depth: int,
    on_response: Callable[[Answer], None] | None,
    seen: dict[str, Any],
) -> Any:
    template = machine.feed(feed_name).url
    url = render_url(template, label=label, state_machine=machine.name)
    secrets = headers_for(machine, template)
    home = _origin(url)
    started = time.monotonic()
    deadline = started + timeout
    for _ in range(MAX_REDIRECTS + 1):
        headers = {"Accept": "application/json", **(secrets if _origin(url) == home else {})}
        seen["url"] = url
        try:
            answer = send(
                session,
                "GET",
                url,
                headers=headers,
                deadline=deadline,
                max_response_bytes=max_response_bytes,
            )
        except OutboundError as error:
            seen["timeout"] = isinstance(error, OutboundTimeout)
            if observe is not None:
                observe(url, None, time.monotonic() - started)
            raise _unavailable(machine, feed_name, label, url, str(error)) from None
        seen["answer"] = answer
        if observe is not None:
            observe(url, answer.status, time.monotonic() - started)
        location = answer.headers.get("Location")
        if answer.status not in _REDIRECTS or not location:
            break
        url = urljoin(url, location)
        if _origin(url)[0] not in ("http", "https"):
            raise _unavailable(
                machine, feed_name, label, url, "redirected to a URL that is not http(s)"
            )
    else:
        raise _unavailable(machine, feed_name, label, url, f"over {MAX_REDIRECTS} redirects")
    if on_response is not None:  # the final answer, as 1.x's plugins were told
        on_response(answer)
    if not 200 <= answer.status < 300:
        raise _unavailable(machine, feed_name, label, url, f"returned status {answer.status}")
    if not answer.complete:
        raise _unavailable(
            machine, feed_name, label, url, f"answered more than {max_response_bytes} bytes"
        )
    try:
        return parse_json(answer.body, max_depth=max_depth)
    except JSONRejected as error:
        raise _unavailable(
            machine,
            feed_name,
            label,
            url,
            f"returned status {answer.status} with a body that is {error}",
        ) from None


def _origin(url: str) -> tuple[str, str, int | None]:
    try:
        return origin(url)
    except ValueError:  # an invalid port
        return ("", "", None)


def _unavailable(
    machine: StateMachine, feed: str, label: str, url: str, problem: str
) -> FeedUnavailable:
    """The exception to raise, logged here with the URL and status (once per failure)."""
    reason = problem if problem.startswith("GET ") else f"GET {url} {problem}"
    logger.warning(
        "feed unavailable: %s",
        reason,
        extra={"state_machine": machine.name, "feed": feed, "label": label, "url": url},
    )
    return FeedUnavailable(feed, reason)
