"""The worker's part of the delivery log: what each call came to, written with what it did.

A call's entry is written in the one transaction that records what the call
did to its label, so the log never lags the label and a crash cannot
separate them: a failed call's by its slot, with the retry, the errored mark
or the probe put back (:mod:`~routemaster.worker.delivery`); a 202 that
became a task with the task's hold (:mod:`~routemaster.worker.callbacks`);
a delivered call's by the loop, in the transaction that moves the delivered
labels on (many labels, one statement for their entries). Between the slot
and that transaction the entry waits here, in memory: a worker killed then
has moved neither the label nor written the entry, and the label is
delivered again once its lease runs out.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from routemaster.app import App
from routemaster.db import deliveries, receivers
from routemaster.db.claims import Claim
from routemaster.db.deliveries import Delivery
from routemaster.http.calls import Call
from routemaster.worker.receivers import Permit

Answered = Callable[[set[str], datetime.datetime], list[str]]
"""Of the receivers that answered, those whose rows need the success written."""


def webhook_delivery(claim: Claim, permit: Permit, call: Call) -> Delivery:
    """The log entry of one webhook call for a claimed label."""
    return deliveries.entry_for(
        call,
        kind="webhook",
        receiver=permit.receiver.id,
        trigger=permit.trigger,
        attempt=claim.attempts + 1 if permit.probe else claim.attempts,
        state_machine=claim.state_machine,
        label=claim.name,
        state=claim.state,
    )


def observe(app: App, delivery: Delivery) -> None:
    """Count the call in the process's metrics (per receiver, kind and outcome)."""
    if app.metrics is not None:
        app.metrics.observe_call(delivery)


def write_answered(
    conn: sa.Connection,
    entries: Sequence[Delivery],
    *,
    now: datetime.datetime,
    answered: Answered | None = None,
) -> None:
    """Write answered calls' entries and close their receivers' circuits, in ``conn``.

    ``answered`` picks the receivers whose rows need the success written
    (default: all of them).
    """
    if entries:
        deliveries.record(conn, entries)
        ids = {entry.receiver for entry in entries}
        receivers.succeeded(conn, answered(ids, now) if answered else sorted(ids), now=now)


Delivered = tuple[Claim, Delivery]


class Recorder:
    """Delivered calls between their slot and the loop's transaction that moves their labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delivered: dict[tuple[str, str, int], Delivery] = {}
        self._unwritten: list[Delivered] = []  # taken once, but their transaction failed
        self._failures = 0

    def delivered(self, claim: Claim, entry: Delivery) -> None:
        """A slot's call was answered 2xx: the loop writes ``entry`` when it moves the label."""
        with self._lock:
            self._delivered[claim.entry] = entry

    def take(self, claims: Sequence[Claim]) -> list[Delivered]:
        """The delivered ``claims`` with their entries."""
        with self._lock:
            return [(claim, self._delivered.pop(claim.entry)) for claim in claims]

    def restore(self, taken: Sequence[Delivered]) -> None:
        """What :meth:`take` gave, not written (its transaction failed): for
        :meth:`take_unwritten`."""
        with self._lock:
            self._unwritten[:0] = taken

    def take_unwritten(self) -> list[Delivered]:
        """Delivered calls whose labels' move failed, to be tried again."""
        with self._lock:
            taken, self._unwritten = self._unwritten, []
        return taken

    def failed(self) -> None:
        """A call failed (and was recorded by its slot): receivers' states may have changed."""
        with self._lock:
            self._failures += 1

    def take_failures(self) -> int:
        with self._lock:
            failures, self._failures = self._failures, 0
        return failures
