"""Which due deliveries this worker may claim now, receiver by receiver.

Each round the worker reads the receivers' shared rows and asks each for at
most what it may take: nothing from a paused receiver, one whose
``Retry-After`` has not passed, or one whose circuit is open (once its
cooldown is over, one probe, which uses no attempt); for a receiver with a
``rate``, what its rate allows now (the shared ``rate_at`` advances one
interval per call, under the row's lock); with ``max_in_flight``, what the
workers' calls in flight leave. And never more than this worker's share of
its own slots, so that a slow receiver cannot take all of them. Labels a
receiver may not take now are simply not claimed: they wait, attempts
untouched, and the worker wakes when the earliest receiver opens up.
"""

from __future__ import annotations

import datetime
import math
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Config
from routemaster.config.origins import Receiver, configured_receivers
from routemaster.config.receiver_rules import Rate
from routemaster.db import label_claims
from routemaster.db import receivers as shared
from routemaster.db.claimed import Claim
from routemaster.db.deliveries import Delivery
from routemaster.db.label_claims import ReceiverClaim, StateKey, Wanted
from routemaster.db.receivers import ReceiverRow
from routemaster.service.batch_moves import move_delivered
from routemaster.service.flow_claims import RECHECK, flow_states, flows_of, serve_flow
from routemaster.service.transactions import writing

RATE_TOLERANCE = 0.1  # seconds of calls a rate lets go at once (at least one call)
RATE_BATCH = 0.05  # seconds of calls worth waking up for when a rate holds work back
CLEAR_FOR = 0.25  # seconds the rows of unlimited receivers, all closed, are trusted unread
SUCCESS_EVERY = datetime.timedelta(seconds=1)  # a closed receiver's last success, rewritten


@dataclass(frozen=True)
class Permit:
    """Why this worker may make the call: its receiver, and how the delivery log names it."""

    receiver: Receiver
    probe: bool
    trigger: str  # scheduled, retry, manual, probe
    was_due: datetime.datetime


@dataclass(frozen=True)
class Claimed:
    """What :meth:`Gatekeeper.claim` did: the deliveries claimed, and the delivered labels
    moved on that were leased to read feeds."""

    deliveries: list[tuple[Claim, Permit]]
    waiting: list[Claim]


class Gatekeeper:
    """Claims due deliveries receiver by receiver, for one worker (it keeps what it read)."""

    def __init__(self, app: App, slots: int, config: Config | None = None) -> None:
        """``config``: what to claim for (the worker's view, with older versions' states)."""
        self.app = app
        self.receivers = configured_receivers(config or app.config)
        self._calling = [r for r in self.receivers.values() if r.action_states]
        self._routes = [
            (receiver.id, machine, state)
            for receiver in self._calling
            for machine, state in receiver.action_states
        ]
        # With several receivers, none may hold more than half the slots: a slow one
        # leaves the rest to the others.
        self.share = slots if len(self._calling) <= 1 else max(1, slots // 2)
        self.wake_at: datetime.datetime | None = None
        self._ensured = False
        self._unlimited = [
            r.id for r in self._calling if not (r.policy.rate or r.policy.max_in_flight)
        ]
        # The rows of the receivers without limits while every one is closed: re-read at
        # most every CLEAR_FOR seconds, and at once after a failed call (invalidate).
        self._clear: tuple[float, dict[str, ReceiverRow]] | None = None
        self._known: dict[str, ReceiverRow] = {}
        self._success_written: dict[str, datetime.datetime] = {}
        # actions with ``flow:`` (SPEC G2): claimed key by key, fairly, under their caps
        self._flow_states = flow_states(config or app.config)

    def invalidate(self) -> None:
        """A call failed: read the receivers' rows again before the next claim."""
        self._clear = None

    def answered(self, ids: set[str], now: datetime.datetime) -> list[str]:
        """Of receivers that just answered, those whose rows need the success written."""
        due = []
        for ident in sorted(ids):
            row = self._known.get(ident)
            written = self._success_written.get(ident)
            if (
                row is None
                or row.circuit != "closed"
                or row.failures_in_a_row
                or written is None
                or now - written >= SUCCESS_EVERY
            ):
                due.append(ident)
                self._success_written[ident] = now
        return due

    def claim(
        self,
        free: int,
        held: Counter[str],
        *,
        delivered: Sequence[tuple[Claim, Delivery]] = (),
        states: Collection[StateKey] | None = None,
    ) -> Claimed:
        """Lease due deliveries for up to ``free`` slots; ``held``: calls in flight per receiver.

        The ``delivered`` labels (with their calls' log entries) are moved on
        at the start of the same transaction, saving a transaction per round
        (:func:`~routemaster.service.batch_moves.move_delivered`).
        ``states``: only these action states (a minutely sweep's one); None: all.
        """
        routes, calling = self._routes, self._calling
        if states is not None:
            routes = [route for route in routes if (route[1], route[2]) in states]
            callers = {route[0] for route in routes}
            calling = [receiver for receiver in calling if receiver.id in callers]
        self.wake_at = None
        now = self.app.now()
        lease_until = now + self.app.settings.lease
        worker_id = self.app.settings.worker_id
        with writing(self.app) as conn:
            waiting = move_delivered(
                conn,
                self.app,
                [claim for claim, _ in delivered],
                [entry for _, entry in delivered],
                self.answered,
            )
            if free <= 0 or not calling:
                return Claimed([], waiting)
            if not self._ensured:  # again after a rollback: a receiver's row is missing
                shared.ensure(conn, [(r.id, r.origin) for r in self.receivers.values()])
            limited = [r.id for r in calling if r.policy.rate or r.policy.max_in_flight]
            rows = {row.id: row for row in shared.some(conn, limited, lock=True)}
            rows.update(self._unlimited_rows(conn, now))
            self._known = rows
            self._ensured = all(r.id in rows for r in calling)
            others = shared.others_in_flight(
                conn,
                {r.id: held[r.id] for r in calling if r.policy.max_in_flight},
                worker_id=worker_id,
                now=now,
                expires_at=lease_until,
            )
            wanted: list[Wanted] = []
            probes: set[str] = set()
            for receiver in calling:
                row = rows.get(receiver.id)
                if row is None:
                    continue
                want = self._wanted(receiver, row, free, held, others, now)
                if (
                    want is None
                    and row.circuit != "closed"
                    and self._may_probe(row, now)
                    and shared.start_probe(conn, receiver.id, now=now, probe_until=lease_until)
                ):
                    want = Wanted(receiver.id, 1, counted=False)
                    probes.add(receiver.id)
                if want is not None:
                    wanted.append(want)
            from_flows = self._claim_flows(conn, wanted, routes, free, now, lease_until)
            plain = [route for route in routes if (route[1], route[2]) not in self._flow_states]
            claimed = from_flows + label_claims.claim_deliveries(
                conn,
                # the receivers with other actions, for what the flows left them
                _still_wanted(
                    [want for want in wanted if any(r[0] == want.receiver for r in plain)],
                    from_flows,
                ),
                plain,
                free=free - len(from_flows),
                now=now,
                lease_until=lease_until,
                worker_id=worker_id,
            )
            taken = Counter(item.receiver for item in claimed)
            shared.set_rate_at(
                conn,
                {
                    receiver.id: next_rate_at(
                        receiver.policy.rate, rows[receiver.id].rate_at, now, taken[receiver.id]
                    )
                    for receiver in calling
                    if receiver.policy.rate is not None and taken[receiver.id]
                },
            )
            for ident in probes - set(taken):
                shared.no_probe(conn, ident, now=now)
        return Claimed([(item.claim, self._permit(item)) for item in claimed], waiting)

    def _claim_flows(
        self,
        conn: sa.Connection,
        wanted: Sequence[Wanted],
        routes: Sequence[tuple[str, str, str]],
        free: int,
        now: datetime.datetime,
        lease_until: datetime.datetime,
    ) -> list[ReceiverClaim]:
        """Deliveries from the flows of the wanted receivers, each up to what its receiver
        may take; the rest of the slots go to their other actions."""
        if not self._flow_states:
            return []
        by_receiver = flows_of(routes, self._flow_states)
        taken: list[ReceiverClaim] = []
        for want in wanted:
            limit = want.limit
            for flow in by_receiver.get(want.receiver, []):
                slots = min(limit, free - len(taken))
                if slots <= 0:
                    break
                got = serve_flow(
                    conn,
                    flow,
                    slots,
                    now=now,
                    lease_until=lease_until,
                    worker_id=self.app.settings.worker_id,
                    counted=want.counted,
                )
                if got.backlog:
                    self._wake(now + RECHECK)
                limit -= len(got.claims)
                taken += [
                    ReceiverClaim(claim, want.receiver, queued_at, error, want.counted)
                    for claim, queued_at, error in got.claims
                ]
        return taken

    def release(self) -> None:
        """The worker stops with no call in flight: its share of every receiver's
        ``max_in_flight`` goes to the other workers now, not when its count expires."""
        limited = {r.id: 0 for r in self._calling if r.policy.max_in_flight}
        now = self.app.now()
        worker_id = self.app.settings.worker_id
        with writing(self.app) as conn:
            shared.others_in_flight(conn, limited, worker_id=worker_id, now=now, expires_at=now)

    def _wanted(
        self,
        receiver: Receiver,
        row: ReceiverRow,
        free: int,
        held: Counter[str],
        others: dict[str, int],
        now: datetime.datetime,
    ) -> Wanted | None:
        """How many of its due labels ``receiver`` may take now (None: none)."""
        if row.paused:
            return None
        if row.not_before is not None and row.not_before > now:
            self._wake(row.not_before)
            return None
        if row.circuit != "closed":
            if row.open_until is not None and row.open_until > now:
                self._wake(row.open_until)
            return None
        limit = min(free, self.share - held[receiver.id])
        policy = receiver.policy
        if policy.max_in_flight is not None:
            others_hold = others.get(receiver.id, 0)
            limit = min(limit, policy.max_in_flight - held[receiver.id] - others_hold)
        if policy.rate is not None:
            allowed, wake_at = rate_allows(policy.rate, row.rate_at, now)
            if allowed <= 0:
                self._wake(wake_at)
                return None
            limit = min(limit, allowed)
        return Wanted(receiver.id, limit) if limit > 0 else None

    def _unlimited_rows(
        self, conn: sa.Connection, now: datetime.datetime
    ) -> dict[str, ReceiverRow]:
        clear = self._clear
        if clear is not None and time.monotonic() - clear[0] < CLEAR_FOR:
            return clear[1]
        rows = {row.id: row for row in shared.some(conn, self._unlimited)}
        all_clear = all(
            row.circuit == "closed"
            and not row.paused
            and (row.not_before is None or row.not_before <= now)
            for row in rows.values()
        )
        self._clear = (time.monotonic(), rows) if all_clear else None
        return rows

    @staticmethod
    def _may_probe(row: ReceiverRow, now: datetime.datetime) -> bool:
        return not row.paused and (row.open_until is None or row.open_until <= now)

    def _wake(self, at: datetime.datetime) -> None:
        if self.wake_at is None or at < self.wake_at:
            self.wake_at = at

    def _permit(self, item: ReceiverClaim) -> Permit:
        attempts = item.claim.attempts
        if not item.counted:
            trigger = "probe"
        elif attempts > 1:
            trigger = "retry"
        else:
            trigger = "manual" if item.last_error is not None else "scheduled"
        return Permit(self.receivers[item.receiver], not item.counted, trigger, item.was_due)


def _still_wanted(wanted: Sequence[Wanted], taken: Sequence[ReceiverClaim]) -> list[Wanted]:
    """What each receiver may still take after ``taken``."""
    counts = Counter(item.receiver for item in taken)
    return [
        replace(want, limit=want.limit - counts[want.receiver])
        for want in wanted
        if want.limit - counts[want.receiver] > 0
    ]


def rate_allows(
    rate: Rate, rate_at: datetime.datetime | None, now: datetime.datetime
) -> tuple[int, datetime.datetime]:
    """How many calls ``rate`` lets go now, and (when none) when enough for a batch will.

    ``rate_at`` is the rate's theoretical arrival time: each call moves it one
    interval on, and calls may go while it is less than the tolerance ahead
    of now. Over any window the calls are at most the rate plus the tolerance.
    """
    interval = rate.interval
    tolerance = max(interval, RATE_TOLERANCE)
    behind = max(rate_at or now, now)
    allowed = math.floor(((now - behind).total_seconds() + tolerance) / interval + 1e-9)
    batch = max(1, math.floor(RATE_BATCH / interval))
    return allowed, behind + datetime.timedelta(seconds=batch * interval - tolerance)


def next_rate_at(
    rate: Rate, rate_at: datetime.datetime | None, now: datetime.datetime, calls: int
) -> datetime.datetime:
    """The rate's arrival time after ``calls`` more calls."""
    return max(rate_at or now, now) + datetime.timedelta(seconds=calls * rate.interval)
