"""The worker's part of the delivery log: what each call came to, written after the call.

A failed call is written by its slot in the one short transaction that also
records what the failure means for the label and the receiver. Answered
calls are buffered here and written by the loop in one statement for many
calls (at least :data:`BATCH`, or the oldest :data:`DELAY` seconds old), in
the transaction that claims the next work, with their receivers' circuits
closed in it: recording a successful call costs a fraction of a statement.
A worker that is killed loses the entries it had not written yet (its
labels' outcomes too: they are delivered again).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from routemaster.app import App
from routemaster.db import deliveries, receivers
from routemaster.db.claims import Claim
from routemaster.db.deliveries import Delivery
from routemaster.http.calls import Call
from routemaster.worker.receivers import Permit

BATCH = 64  # answered calls written together
DELAY = 0.25  # seconds the oldest waits at most


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


class Recorder:
    """Answered calls waiting to be written by the loop (slots add, the loop takes)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._pending: list[Delivery] = []
        self._oldest: float | None = None  # when the oldest pending entry came
        self._failures = 0

    def failed(self) -> None:
        """A call failed (and was recorded by its slot): receivers' states may have changed."""
        with self._lock:
            self._failures += 1

    def take_failures(self) -> int:
        with self._lock:
            failures, self._failures = self._failures, 0
        return failures

    def answered(self, delivery: Delivery) -> None:
        with self._lock:
            if not self._pending:
                self._oldest = self._clock()
            self._pending.append(delivery)

    def deadline(self) -> float | None:
        """When (``clock`` time) the pending entries must be written; None: nothing pending."""
        with self._lock:
            return None if self._oldest is None else self._oldest + DELAY

    def take_due(self) -> list[Delivery]:
        """The pending entries if it is time to write them (enough, or old enough), else none."""
        with self._lock:
            if self._oldest is None or (
                len(self._pending) < BATCH and self._clock() < self._oldest + DELAY
            ):
                return []
        return self.take()

    def take(self) -> list[Delivery]:
        """What is pending; give it back with :meth:`restore` if it could not be written."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._oldest = None
        return pending

    def restore(self, pending: list[Delivery]) -> None:
        if pending:
            with self._lock:  # written with the next round's
                self._pending[:0] = pending
                self._oldest = self._clock()

    @staticmethod
    def write(
        conn: sa.Connection,
        pending: list[Delivery],
        *,
        now: datetime.datetime,
        answered: Callable[[set[str], datetime.datetime], list[str]] | None = None,
    ) -> None:
        """Write ``pending`` and close the answering receivers' circuits, in ``conn``.

        ``answered`` picks the receivers whose rows need the success written
        (default: all of them).
        """
        if pending:
            deliveries.record(conn, pending)
            ids = {entry.receiver for entry in pending}
            receivers.succeeded(conn, answered(ids, now) if answered else sorted(ids), now=now)

    def flush(self, app: App, *, only_due: bool = False) -> int:
        """Write what is pending (if ``only_due``, only once due) in a transaction of its own."""
        pending = self.take_due() if only_due else self.take()
        if pending:
            try:
                with app.db.begin() as conn:
                    self.write(conn, pending, now=app.now())
            except Exception:
                self.restore(pending)
                raise
        return len(pending)
