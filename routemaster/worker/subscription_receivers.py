"""Subscription batches through the receivers (SPEC D4): their limits, their circuit, the log.

A subscription's URL reaches a receiver (its origin), shared with any action
webhook or feed of the same origin. Before each send the receiver's row is
read under its lock, as the worker's claims do
(:mod:`routemaster.worker.receivers`):

- paused: the batch waits (looked at again every second);
- ``Retry-After`` not passed, or the circuit open in its cooldown: it waits
  until then;
- the circuit open and its cooldown over: this send is the one probe;
- a ``rate``: the send takes the next slot of the shared rate, or waits for it;
- ``max_in_flight``: the sender's sends in flight to the receiver are counted
  with the other workers' calls (``receiver_slots``, as this worker's
  ``WORKER/subscriptions``), and a send waits while the receiver is full.

Waiting uses no attempt and leaves the batch as it is. After the send, in
the transaction that records its outcome (and moves the cursor on a 2xx), the
call is written to the delivery log (``kind: "subscription"``) and counted
for or against the receiver's circuit; ``Retry-After`` also delays the batch.
"""

from __future__ import annotations

import datetime
import threading
from collections import Counter
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.origins import Receiver, receiver_for_url
from routemaster.db import deliveries
from routemaster.db import receivers as shared
from routemaster.db.deliveries import Delivery
from routemaster.db.subscriptions import Subscription
from routemaster.http.webhooks import DeliveryResult
from routemaster.worker.batches import Hold, ReceiverSeam

PAUSED_RECHECK = datetime.timedelta(seconds=1)
FULL_RECHECK = datetime.timedelta(milliseconds=50)  # max_in_flight reached
RATE_TOLERANCE = 0.1  # seconds of calls a rate lets go at once, as for webhooks


@dataclass(frozen=True)
class Permit:
    receiver: Receiver
    probe: bool
    counted: bool  # held against max_in_flight until finished


class SubscriptionReceivers(ReceiverSeam):
    def __init__(self, app: App) -> None:
        self.app = app
        self.slot_owner = f"{app.settings.worker_id}/subscriptions"
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()  # sends in flight per receiver, this sender

    def may_send(self, app: App, subscription: Subscription) -> Hold | Permit:
        receiver = receiver_for_url(app.config, subscription.url)
        policy = receiver.policy
        now = app.now()
        lease = now + datetime.timedelta(seconds=app.settings.subscription_lease)
        with app.db.begin() as conn:
            rows = shared.some(conn, [receiver.id], lock=True)
            if not rows:  # its first call: a new receiver starts closed
                shared.ensure(conn, [(receiver.id, receiver.origin)])
                rows = shared.some(conn, [receiver.id], lock=True)
            [row] = rows
            if row.paused:
                return Hold(now + PAUSED_RECHECK, f"the receiver {receiver.origin} is paused")
            if row.not_before is not None and row.not_before > now:
                return Hold(row.not_before, f"{receiver.origin} asked to wait (Retry-After)")
            if row.circuit != "closed":
                if row.open_until is not None and row.open_until > now:
                    return Hold(row.open_until, f"the circuit of {receiver.origin} is open")
                if not shared.start_probe(conn, receiver.id, now=now, probe_until=lease):
                    return Hold(now + PAUSED_RECHECK, f"{receiver.origin} is being probed")
                return self._take(conn, receiver, probe=True, now=now, lease=lease)
            if policy.max_in_flight is not None:
                with self._lock:
                    mine = self._held[receiver.id]
                others = shared.others_in_flight(
                    conn,
                    {receiver.id: mine},
                    worker_id=self.slot_owner,
                    now=now,
                    expires_at=lease,
                ).get(receiver.id, 0)
                if mine + others >= policy.max_in_flight:
                    return Hold(now + FULL_RECHECK, f"{receiver.origin} is at its max_in_flight")
            if policy.rate is not None:
                interval = policy.rate.interval
                slack = max(interval, RATE_TOLERANCE) - interval
                behind = max(row.rate_at or now, now)
                if (behind - now).total_seconds() > slack:
                    wait = behind - datetime.timedelta(seconds=slack)
                    return Hold(wait, f"{receiver.origin} is at its rate ({policy.rate})")
                shared.set_rate_at(
                    conn, {receiver.id: behind + datetime.timedelta(seconds=interval)}
                )
            return self._take(conn, receiver, probe=False, now=now, lease=lease)

    def _take(
        self,
        conn: sa.Connection,
        receiver: Receiver,
        *,
        probe: bool,
        now: datetime.datetime,
        lease: datetime.datetime,
    ) -> Permit:
        counted = receiver.policy.max_in_flight is not None
        if counted:
            with self._lock:
                self._held[receiver.id] += 1
                mine = self._held[receiver.id]
            shared.others_in_flight(
                conn, {receiver.id: mine}, worker_id=self.slot_owner, now=now, expires_at=lease
            )
        return Permit(receiver, probe, counted)

    def record(
        self,
        conn: sa.Connection,
        subscription: Subscription,
        permit: object,
        result: DeliveryResult,
    ) -> None:
        assert isinstance(permit, Permit)
        call = result.call
        if call is None:
            return
        receiver = permit.receiver
        now = self.app.now()
        failures = subscription.failures_in_a_row
        deliveries.record(
            conn,
            [
                Delivery(
                    kind="subscription",
                    state_machine=None,
                    label=None,
                    state=None,
                    url=call.url,
                    receiver=receiver.id,
                    attempt=failures + 1,
                    trigger="probe" if permit.probe else "retry" if failures else "scheduled",
                    started_at=call.started_at,
                    duration_ms=call.duration_ms,
                    status=call.status,
                    outcome=call.outcome,
                    error=call.error,
                    response_excerpt=call.excerpt,
                )
            ],
        )
        if not call.receiver_failed:  # it answered: the receiver is up
            shared.succeeded(conn, [receiver.id], now=now)
            return
        circuit = receiver.policy.circuit
        shared.failed(
            conn,
            shared.Failure(
                receiver=receiver.id,
                at=now,
                error=call.error or f"status {call.status}",
                counted=True,
                probe=permit.probe,
                threshold=circuit.failures,
                reopen_at=now + circuit.cooldown,
                retry_until=None if call.retry_after is None else now + call.retry_after,
            ),
        )

    def finished(self, permit: object) -> None:
        """One send fewer in flight: written at once, so other workers need not wait for it."""
        if not (isinstance(permit, Permit) and permit.counted):
            return
        ident = permit.receiver.id
        with self._lock:
            self._held[ident] -= 1
            mine = self._held[ident]
        now = self.app.now()
        lease = now + datetime.timedelta(seconds=self.app.settings.subscription_lease)
        with self.app.db.begin() as conn:
            shared.others_in_flight(
                conn, {ident: mine}, worker_id=self.slot_owner, now=now, expires_at=lease
            )
