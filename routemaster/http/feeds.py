"""Fetching a feed for an evaluation: one GET, JSON back, or :class:`FeedUnavailable`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import requests

from routemaster.config.model import StateMachine
from routemaster.exit_conditions.context import FeedUnavailable
from routemaster.http.headers import headers_for
from routemaster.http.urls import render_url

logger = logging.getLogger(__name__)

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
    on_response: Callable[[requests.Response], None] | None = None,
) -> Any:
    """The decoded JSON body of ``feed_name`` for ``label``.

    Any failure (network, timeout, non-2xx status, a body that is not JSON)
    raises :class:`FeedUnavailable` naming the URL and the status, so the
    evaluation decides nothing and the label stays in its gate to be retried.
    ``on_response`` is told of the response, if one came (the logging plugins' hook).
    """
    url = render_url(machine.feed(feed_name).url, label=label, state_machine=machine.name)
    headers = {"Accept": "application/json", **headers_for(machine, url)}
    started = time.monotonic()
    try:
        response = session.get(url, headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        if observe is not None:
            observe(url, None, time.monotonic() - started)
        raise _unavailable(
            machine, feed_name, label, url, f"failed: {type(exc).__name__}: {exc}"
        ) from exc
    if observe is not None:
        observe(url, response.status_code, time.monotonic() - started)
    if on_response is not None:
        on_response(response)
    if not 200 <= response.status_code < 300:
        raise _unavailable(
            machine, feed_name, label, url, f"returned status {response.status_code}"
        )
    try:
        return response.json()
    except ValueError:
        raise _unavailable(
            machine,
            feed_name,
            label,
            url,
            f"returned status {response.status_code} with a body that is not JSON",
        ) from None


def _unavailable(
    machine: StateMachine, feed: str, label: str, url: str, problem: str
) -> FeedUnavailable:
    """The exception to raise, logged here with the URL and status (once per failure)."""
    reason = f"GET {url} {problem}"
    logger.warning(
        "feed unavailable: %s",
        reason,
        extra={"state_machine": machine.name, "feed": feed, "label": label, "url": url},
    )
    return FeedUnavailable(feed, reason)
