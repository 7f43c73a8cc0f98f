"""Keeping every held task's lease alive, on a thread of its own.

A lease is extended once a third of it has passed (:data:`~routemaster.client.book.BEAT_FRACTION`),
so two heartbeats in a row may fail (a network blip, a restart of the
service) before it runs out. Each heartbeat is tried once per turn: one
lease's trouble never holds up another's; a heartbeat without an answer is
tried again soon, sooner as the lease nears its end. A ``409 lease_lost``
(or 404) marks the task lost: its handler's result will be dropped.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time

from routemaster.client.book import Book, Held
from routemaster.client.service import Service, expiry_in

logger = logging.getLogger(__name__)

IDLE_TURN = 1.0  # seconds between looks when no lease is due
RETRY_AT_MOST = 1.0  # seconds before a heartbeat without an answer is tried again, at most
RETRY_AT_LEAST = 0.05


def keep_leases(book: Book, service: Service, finished: threading.Event) -> None:
    """Heartbeat each held task when it is due, until ``finished``."""
    while not finished.is_set():
        due = _due(book)
        for held in due:
            _beat(book, service, held)


def _due(book: Book) -> list[Held]:
    """The leases to extend now; waits (woken by any change) until one is due."""
    with book.changed:
        now = time.monotonic()
        beating = [h for h in book.held.values() if h.state in ("running", "finished")]
        due = [held for held in beating if held.beat_at <= now]
        if not due:
            soonest = min((held.beat_at for held in beating), default=now + IDLE_TURN)
            book.leased.wait(min(max(soonest - now, 0.0), IDLE_TURN))
        return due


def _beat(book: Book, service: Service, held: Held) -> None:
    answer = service.heartbeat(held.task.id)
    now = time.monotonic()
    if isinstance(answer, str):
        left = held.deadline - now
        with book.lock:
            held.beat_at = now + min(RETRY_AT_MOST, max(left / 4, RETRY_AT_LEAST))
        logger.warning(
            "heartbeat of %s/%s: %s; %.1f s of its lease left",
            held.task.state_machine,
            held.task.label,
            answer,
            left,
        )
    elif answer.ok:
        expires = datetime.datetime.fromisoformat(answer.body["lease_expires_at"])
        with book.lock:
            held.extended(expiry_in(expires), now)
    else:
        was = book.lose(held.task.id)
        if was in ("running", "finished"):
            logger.warning(
                "lease of %s/%s lost (%s): its result will be dropped; the service may give "
                "it to another worker",
                held.task.state_machine,
                held.task.label,
                answer.message or answer.body.get("reason"),
            )
