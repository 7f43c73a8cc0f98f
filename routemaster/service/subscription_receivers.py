"""Subscription batches through the receivers (SPEC D4): their limits, their circuit, the log.

A subscription's URL reaches a receiver (its origin), shared with any action
webhook or feed of the same origin. Each send goes through the receivers'
one-call interface (:mod:`routemaster.service.receiver_calls`):

- before it, :func:`~routemaster.service.receiver_calls.acquire`: a paused receiver,
  ``Retry-After`` not passed, an open circuit in its cooldown or a full rate
  make the batch wait (no failure counted, the batch unchanged); once a
  circuit's cooldown is over, this send may be the one probe;
- ``max_in_flight`` (which the one-call interface leaves to its callers): the
  sender's sends in flight to the receiver count with every worker's calls
  (``receiver_slots``, as this worker's ``WORKER/subscriptions``);
- after it, in the transaction that records its outcome (and moves the cursor
  on a 2xx), :func:`~routemaster.service.receiver_calls.record_call`: the delivery
  log's entry (``kind: "subscription"``) and the call counted for or against
  the receiver's circuit.
"""

from __future__ import annotations

import datetime
import threading
from collections import Counter
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.origins import receiver_for_url
from routemaster.db import receivers as shared
from routemaster.db.subscriptions import Subscription
from routemaster.http.webhooks import DeliveryResult
from routemaster.service.batch_sending import Hold, ReceiverSeam
from routemaster.service.receiver_calls import Allowed, acquire, record_call
from routemaster.service.transactions import writing

FULL_RECHECK = datetime.timedelta(milliseconds=50)  # max_in_flight reached: ask again


@dataclass(frozen=True)
class Permit:
    allowed: Allowed
    counted: bool  # held against max_in_flight until finished


class SubscriptionReceivers(ReceiverSeam):
    def __init__(self, app: App) -> None:
        self.app = app
        self.slot_owner = f"{app.settings.worker_id}/subscriptions"
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()  # sends in flight per receiver, this sender

    def may_send(self, app: App, subscription: Subscription) -> Hold | Permit:
        receiver = receiver_for_url(app.config, subscription.url)
        limit = receiver.policy.max_in_flight
        if limit is not None:
            with self._lock:
                mine = self._held[receiver.id] + 1  # with this one
                self._held[receiver.id] = mine
            if self._others(receiver.id, mine) + mine > limit:
                self._release(receiver.id)
                return Hold(app.now() + FULL_RECHECK, f"{receiver.origin} is at max_in_flight")
        allowed = acquire(app, subscription.url)
        if isinstance(allowed, datetime.datetime):
            if limit is not None:
                self._release(receiver.id)
            return Hold(
                allowed,
                f"waiting for the receiver {receiver.origin} (paused, asked to wait, its "
                f"circuit open or at its rate) until {allowed.isoformat()}",
            )
        return Permit(allowed, counted=limit is not None)

    def record(
        self,
        conn: sa.Connection,
        subscription: Subscription,
        permit: object,
        result: DeliveryResult,
    ) -> None:
        assert isinstance(permit, Permit)
        if result.call is None:
            return
        failures = subscription.failures_in_a_row
        record_call(
            conn,
            self.app,
            permit.allowed,
            result.call,
            kind="subscription",
            trigger="retry" if failures else "scheduled",
            attempt=failures + 1,
        )

    def finished(self, permit: object) -> None:
        if isinstance(permit, Permit) and permit.counted:
            self._release(permit.allowed.receiver.id)

    def _release(self, ident: str) -> None:
        """One send fewer in flight, written at once so other workers need not wait for it."""
        with self._lock:
            self._held[ident] -= 1
            mine = self._held[ident]
        self._others(ident, mine)

    def _others(self, ident: str, mine: int) -> int:
        """Write this sender's count in flight to ``ident``; the other workers' calls there."""
        now = self.app.now()
        lease = now + datetime.timedelta(seconds=self.app.settings.subscription_lease)
        with writing(self.app) as conn:
            others = shared.others_in_flight(
                conn, {ident: mine}, worker_id=self.slot_owner, now=now, expires_at=lease
            )
        return others.get(ident, 0)
