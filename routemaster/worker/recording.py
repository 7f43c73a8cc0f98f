"""The worker's part of the delivery log: what each call came to, written after the call.

A failed call is written by its slot in the one short transaction that also
records what the failure means for the label and the receiver. Answered
calls are buffered here and written by the loop in one statement per round,
right after the labels they moved on (and their receivers' circuits closed
in the same transaction), so recording costs a round one statement, not a
transaction per call.
"""

from __future__ import annotations

import threading

from routemaster.app import App
from routemaster.db import deliveries, receivers
from routemaster.db.claims import Claim
from routemaster.db.deliveries import Delivery
from routemaster.http.calls import Call
from routemaster.worker.receivers import Permit


def webhook_delivery(claim: Claim, permit: Permit, call: Call) -> Delivery:
    """The log entry of one webhook call for a claimed label."""
    return Delivery(
        kind="webhook",
        state_machine=claim.state_machine,
        label=claim.name,
        state=claim.state,
        url=call.url,
        receiver=permit.receiver.id,
        attempt=claim.attempts + 1 if permit.probe else claim.attempts,
        trigger=permit.trigger,
        started_at=call.started_at,
        duration_ms=call.duration_ms,
        status=call.status,
        outcome=call.outcome,
        error=call.error,
        response_excerpt=call.excerpt,
    )


def observe(app: App, delivery: Delivery) -> None:
    """Count the call in the process's metrics (per receiver, kind and outcome)."""
    if app.metrics is not None:
        app.metrics.observe_call(
            delivery.receiver, delivery.kind, delivery.outcome, delivery.duration_ms / 1000
        )


class Recorder:
    """Answered calls waiting to be written by the loop (slots add, the loop takes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Delivery] = []

    def answered(self, delivery: Delivery) -> None:
        with self._lock:
            self._pending.append(delivery)

    def flush(self, app: App) -> int:
        """Write what is pending and close the answering receivers' circuits: how many."""
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            try:
                with app.db.begin() as conn:
                    deliveries.record(conn, pending)
                    receivers.succeeded(
                        conn, sorted({delivery.receiver for delivery in pending}), now=app.now()
                    )
            except Exception:
                with self._lock:  # written with the next round's
                    self._pending[:0] = pending
                raise
        return len(pending)
