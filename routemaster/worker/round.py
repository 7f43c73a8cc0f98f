"""The worker's round: every kind of work the worker does, in one table, in the order it is done.

:data:`STEPS` is the table. Each :class:`Step` has a name (in logs and in
the statement-timeout metric), a schedule (every so many seconds, or every
round) and a function of the round's :class:`Work`. A round runs the table
top to bottom: a step on a schedule runs when it is due (all of them in the
first round), any other every round. A new kind of work is a new row.

Each step is its own unit of failure: a statement of it that fails (a
statement timeout, a conflict) is logged and the step is tried again at its
next time, never keeping the steps after it waiting; only an unreachable
database stops the round (:meth:`Work.step`). Once the worker is stopping
only the steps marked ``draining`` run: the clock's upkeep (lease renewal
above all) and recording what slots finished; nothing new is claimed or sent.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from routemaster.app import App
from routemaster.config.model import Action, Config, Gate
from routemaster.service import resume_ended_pauses
from routemaster.service.batch_moves import complete_deliveries, evaluate_due_gates
from routemaster.service.bulk import run_batch as run_bulk_batch
from routemaster.service.children import SPAWNS_PER_ROUND, close_left, run_spawns, wake_parents
from routemaster.service.configuration import apply_migrations
from routemaster.service.database import Kind, StoreError, describe_failure
from routemaster.service.delivery_claims import Gatekeeper, Permit
from routemaster.service.in_flight import Claim, StateKey, extend_leases
from routemaster.service.label_counts import FOLD_INTERVAL, FoldPace
from routemaster.service.retention import prune as prune_retained
from routemaster.service.scheduling import schedule_unscheduled
from routemaster.service.tasks import expire_leases, forget_old_tasks
from routemaster.service.unsent import put_back
from routemaster.service.upkeep import give_up_on_open_receivers, prune_deliveries
from routemaster.service.versions import worker_triggers
from routemaster.worker.clock_triggers import ClockTriggers
from routemaster.worker.delivery import deliver_claim
from routemaster.worker.evaluation import evaluate_claim
from routemaster.worker.recording import Recorder
from routemaster.worker.slots import Slots
from routemaster.worker.sweeps import Minutely, Sweep

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

EVERY_ROUND = None
"""The schedule of a step that runs in every round."""

Schedule = Callable[[App], float | None]
"""Seconds between two runs of a step, from the App's settings (``None``: never runs)."""


def seconds(interval: float) -> Schedule:
    return lambda app: interval


def _lease_renewal(app: App) -> float:
    """A third of the lease: two renewals may fail before another worker could take over."""
    return max(1, int(app.settings.lease.total_seconds() / 3))


def _migrations(app: App) -> float | None:
    """Labels a process running the previous configuration moved into a migrated state."""
    if any(machine.migrations for machine in app.config.state_machines):
        return app.settings.migrations_interval
    return None


@dataclass(frozen=True)
class Step:
    """One kind of work: when it runs, what it does, and what its answer means."""

    name: str
    every: Schedule | None  # EVERY_ROUND: each round
    run: Callable[[Work], Any]
    busy: bool = False  # its answer says whether the round found work
    draining: bool = False  # it runs while the worker is stopping too
    # Due now, whatever its schedule says (an interval trigger's occurrence has come).
    due: Callable[[Work], bool] | None = None
    # Due again next round after this answer (None: the step failed).
    again: Callable[[Work, Any], bool] | None = None
    # Due from the worker's first round on (else first due one interval after the start).
    at_once: bool = False


STEPS: tuple[Step, ...] = (
    Step(
        "forgetting old occurrences",
        seconds(60),
        lambda work: work.triggers.forget_old_occurrences(),
        draining=True,
    ),
    Step(
        "clock triggers",
        seconds(1),
        lambda work: work.triggers.fire(),
        draining=True,
        due=lambda work: work.interval_due(),
    ),
    Step("renewing leases", _lease_renewal, lambda work: work.renew_leases(), draining=True),
    Step(
        "pruning the delivery log",
        seconds(60),
        lambda work: prune_deliveries(work.app),
        draining=True,
    ),
    Step(
        "giving up on open receivers",
        seconds(10),
        lambda work: give_up_on_open_receivers(work.app, work.gate.receivers),
        draining=True,
    ),
    Step("applying migrations", _migrations, lambda work: work.apply_migrations(), draining=True),
    # Pull tasks whose lease ran out are failed attempts (routemaster.service.tasks); pauses
    # with an end that has come are over.
    Step("expiring task leases", seconds(1), lambda work: work.expire_tasks(), draining=True),
    Step(
        "forgetting old tasks", seconds(60), lambda work: forget_old_tasks(work.app), draining=True
    ),
    Step("1.x jobs", EVERY_ROUND, lambda work: work.minutely.run_pending(), draining=True),
    # Labels delivered since the last round (and those whose move failed in an earlier
    # round): while draining here, otherwise in the claim's transaction.
    Step(
        "moving delivered labels",
        EVERY_ROUND,
        lambda work: work.move_delivered(),
        busy=True,
        draining=True,
    ),
    Step("claiming deliveries", EVERY_ROUND, lambda work: work.claim_deliveries(), busy=True),
    Step("evaluating due gates", EVERY_ROUND, lambda work: work.evaluate_due_gates(), busy=True),
    # Child labels (SPEC G3): children's words turned into their parents' due times, then
    # due parents spawned a batch or decided, one transaction each; then the children still
    # running of parents that left with ``on_exit: delete``.
    Step(
        "waking parents",
        EVERY_ROUND,
        lambda work: wake_parents(work.app, limit=work.app.settings.batch_size),
        busy=True,
    ),
    Step(
        "spawning and deciding",
        EVERY_ROUND,
        lambda work: run_spawns(work.app, limit=SPAWNS_PER_ROUND),
        busy=True,
    ),
    Step(
        "closing spawns",
        seconds(1),
        lambda work: close_left(work.app, limit=SPAWNS_PER_ROUND),
        at_once=True,
    ),
    # Bulk commands: one batch a round, so deliveries and gates are never kept waiting.
    Step(
        "bulk commands",
        EVERY_ROUND,
        lambda work: run_bulk_batch(work.app, limit=work.app.settings.batch_size),
        busy=True,
    ),
    # Rows written without a next check (by a process of an older release): looked for every
    # 10 s, then a batch a round while batches come back full.
    Step(
        "computing next checks",
        seconds(10),
        lambda work: work.backfill(),
        busy=True,
        again=lambda work, done: done is None or done >= work.app.settings.batch_size,
        at_once=True,
    ),
    # Label counts: the history written since the last fold added to the kept counts.
    Step(
        "folding label counts",
        seconds(FOLD_INTERVAL),
        lambda work: work.fold_pace.fold(work.app),
        draining=True,
        at_once=True,
    ),
    # Retention: history, deleted and finished labels, bulk jobs (one leader per batch). Last,
    # and a run that fails waits for the next interval: it never slows the loop more than once.
    Step(
        "pruning",
        lambda app: app.settings.retention_interval,
        lambda work: prune_retained(work.app),
        at_once=True,
    ),
)


class Round:
    """Runs :data:`STEPS`: keeps each scheduled step's next time, and says when the next is due."""

    def __init__(self, work: Work, steps: Sequence[Step] = STEPS) -> None:
        self._work = work
        self._steps = steps
        # Seconds between runs per scheduled step (a step whose schedule says never is left out),
        # and the time.monotonic() of its next run.
        self._every = {
            step.name: every
            for step in steps
            if step.every is not None and (every := step.every(work.app)) is not None
        }
        start = time.monotonic()
        self._next_at = {
            step.name: -math.inf if step.at_once else start + self._every[step.name]
            for step in steps
            if step.name in self._every
        }
        self._again: set[str] = set()

    def run(self, *, all_due: bool = False) -> bool:
        """One round (``all_due``: every scheduled step is due, as in the worker's first round);
        whether it found work (a step marked ``busy`` answered something)."""
        work = self._work
        busy = False
        for step in self._steps:
            if work.stopping.is_set() and not step.draining:
                continue
            if not (all_due and step.name in self._every) and not self._due(step):
                continue
            if step.name in self._next_at:
                self._next_at[step.name] = time.monotonic() + self._every[step.name]
            answer = work.step(step.name, functools.partial(step.run, work), None)
            if step.again is not None and step.again(work, answer):
                self._again.add(step.name)
            else:
                self._again.discard(step.name)
            busy = busy or (step.busy and bool(answer))
        return busy

    def idle_seconds(self) -> float | None:
        """Seconds until the next scheduled step is due (``None``: none is scheduled)."""
        if not self._next_at:
            return None
        return min(self._next_at.values()) - time.monotonic()

    def _due(self, step: Step) -> bool:
        if step.due is not None and step.due(self._work):
            return True
        if step.name in self._again:
            return True
        if step.every is None:
            return True
        next_at = self._next_at.get(step.name)
        return next_at is not None and time.monotonic() >= next_at


class Work:
    """What the steps work with: the slots, the receivers' gate, the clock, what is in flight."""

    app: App
    gate: Gatekeeper
    triggers: ClockTriggers
    minutely: Minutely
    fold_pace: FoldPace

    def __init__(
        self,
        app: App,
        view: Config,
        *,
        rng: random.Random,
        stopping: threading.Event,
    ) -> None:
        self.app = app
        self.stopping = stopping
        self._rng = rng
        # Pull actions (``worker:``) wait for /tasks/claim: never delivered from here.
        self.action_states = [
            key for key in _states_of_kind(view, Action) if not _pulled(view, key)
        ]
        self._gate_states = _states_of_kind(view, Gate)
        self.slots = Slots(app.settings.delivery_concurrency, on_error=app.hooks.exception)
        self.gate = Gatekeeper(app, self.slots.size, view)
        self._recorder = Recorder()
        self._receiver_of: dict[tuple[str, str, int], str] = {}  # claims in flight
        self._delivered: list[Claim] = []  # finished by slots, not recorded yet
        self.triggers = ClockTriggers(app, sweep=self.sweep_gate, scheduled=worker_triggers(app))
        self.minutely = Minutely(app, self.sweep)
        self.fold_pace = FoldPace()

    def step(self, name: str, work: Callable[[], _T], failed: _T) -> _T:
        """``work()``, or ``failed`` when its statement failed without the database being away.

        An unreachable database (or no pooled connection) is raised: the loop
        waits for it. Anything else the database answered (a statement
        timeout, a conflict) is logged as what it is and the step is tried
        again at its next time.
        """
        try:
            return work()
        except StoreError as error:
            failure = describe_failure(error)
            if failure.kind in (Kind.UNREACHABLE, Kind.BUSY):
                raise
            if failure.kind is Kind.TIMEOUT:
                logger.error("statement timeout while %s; tried again: %s", name, failure.detail)
            else:
                logger.error("%s failed; tried again: %s", name, failure.log_line())
            if self.app.metrics is not None and failure.kind is Kind.TIMEOUT:
                self.app.metrics.statement_timeouts.labels(name).inc()
            return failed

    def interval_due(self) -> bool:
        """Whether an interval trigger's next occurrence has come."""
        due = self.triggers.next_interval_at
        return due is not None and self.app.now() >= due

    def take_delivered(self) -> None:
        """What slots finished since the last round, to be recorded in this one."""
        self._delivered.extend(self.slots.take_done())

    def move_delivered(self) -> bool:
        """While stopping, every delivered label; otherwise only those whose move failed
        before (the labels delivered since the last round move in the claim's transaction)."""
        if self.stopping.is_set():
            return self.complete(self._take())
        return self.complete()

    def claim_deliveries(self) -> bool:
        return self._claim_deliveries(delivered=self._take())

    def evaluate_due_gates(self) -> int:
        evaluated, waiting = evaluate_due_gates(
            self.app, self._gate_states, limit=self.app.settings.batch_size
        )
        self._evaluate(waiting)
        return evaluated

    def backfill(self) -> int:
        """Next checks for a batch of rows written without one."""
        done = schedule_unscheduled(self.app, limit=self.app.settings.batch_size)
        if done and self.app.metrics is not None:
            self.app.metrics.scheduled_late.inc(done)
        return done

    def renew_leases(self) -> None:
        """Keep every claim in flight leased, however long its receiver takes."""
        extend_leases(self.app, self.slots.held())

    def expire_tasks(self) -> None:
        """Count pull tasks whose lease ran out as failed attempts (or errors, at the last);
        resume labels whose pause with ``until`` has ended."""
        expire_leases(self.app, self._rng)
        resume_ended_pauses(self.app)

    def apply_migrations(self) -> None:
        """Migrate labels found in a migrated state (see :mod:`routemaster.service.configuration`).

        A failure is logged and tried again next time: it must not stop the worker.
        """
        try:
            apply_migrations(self.app, wait=False)
        except StoreError:
            raise  # the database is away: the loop waits for it
        except Exception:
            logger.exception("applying the configuration's migrations failed")
            self.app.hooks.exception("applying the configuration's migrations failed")

    def sweep(self, sweep: Sweep) -> None:
        """One of 1.x's minutely jobs (:mod:`~routemaster.worker.sweeps`)."""
        if isinstance(sweep.state, Action):
            self._claim_deliveries([sweep.key])
        else:
            self.sweep_gate(sweep.key)

    def sweep_gate(self, gate: StateKey) -> None:
        """Evaluate one gate's due labels now (those reading feeds go to slots)."""
        if self.stopping.is_set():
            return
        _, waiting = evaluate_due_gates(self.app, [gate], limit=self.app.settings.batch_size)
        self._evaluate(waiting)

    def complete(self, delivered: Sequence[Claim] = ()) -> bool:
        """Move ``delivered`` labels, and those whose move failed before, on and write their
        calls' log entries, in a transaction of their own; whether there were any."""
        taken = self._recorder.take_unwritten() + self._recorder.take(delivered)
        if not taken:
            return False
        try:
            claims, entries = [c for c, _ in taken], [e for _, e in taken]
            waiting = complete_deliveries(self.app, claims, entries, self.gate.answered)
        except Exception:
            self._recorder.restore(taken)  # written with the next round's
            raise
        self._evaluate(waiting)
        return True

    def finish(self) -> None:
        """The worker stops: record the last deliveries, give back the receivers' slots."""
        self.take_delivered()
        self.complete(self._take())
        self.gate.release()

    def _take(self) -> list[Claim]:
        taken, self._delivered = self._delivered, []
        return taken

    def _claim_deliveries(
        self, states: list[StateKey] | None = None, *, delivered: Sequence[Claim] = ()
    ) -> bool:
        """Claim as many due deliveries as there are free slots (any free slot is used);
        whether anything was claimed or moved.

        The claim's transaction first moves the ``delivered`` labels on and writes
        their calls' log entries: one transaction a round, the log never behind.
        """
        states = self.action_states if states is None else states
        free = self.slots.free
        if free <= 0 or not states or self.stopping.is_set():
            return self.complete(delivered)
        held = self.slots.held()
        receiver_of = self._receiver_of
        for entry in set(receiver_of) - {claim.entry for claim in held}:
            del receiver_of[entry]
        in_flight = Counter(receiver_of.values())
        if self._recorder.take_failures():
            self.gate.invalidate()
        taken = self._recorder.take(delivered)
        try:
            outcome = self.gate.claim(
                free,
                in_flight,
                delivered=taken,
                states=None if states is self.action_states else states,
            )
        except Exception:
            self._recorder.restore(taken)  # written with the next round's
            raise
        self._evaluate(outcome.waiting)
        claimed = outcome.deliveries
        if self.stopping.is_set():  # the signal came during the claim: none of it is sent
            put_back(self.app, deliveries=claimed)
            return bool(taken)
        for claim, permit in claimed:
            receiver_of[claim.entry] = permit.receiver.id
            self.slots.submit(claim, self._delivery(permit))
        return bool(claimed or taken)

    def _delivery(self, permit: Permit) -> Callable[[Claim], bool]:
        def deliver(claim: Claim) -> bool:
            if self.stopping.is_set():  # stopped between the claim and this slot
                put_back(self.app, deliveries=[(claim, permit)])
                return False
            return deliver_claim(self.app, claim, self._rng, permit, self._recorder)

        return deliver

    def _evaluate(self, waiting: list[Claim]) -> None:
        if self.stopping.is_set():
            put_back(self.app, gates=waiting)
            return
        for claim in waiting:
            self.slots.submit(claim, self._evaluation)

    def _evaluation(self, claim: Claim) -> bool:
        if self.stopping.is_set():  # stopped between the lease and this slot
            put_back(self.app, gates=[claim])
            return False
        return evaluate_claim(self.app, claim)


def _pulled(config: Config, key: StateKey) -> bool:
    state = config.get_machine(key[0]).get_state(key[1])
    return isinstance(state, Action) and state.pulled


def _states_of_kind(config: Config, kind: type[Action] | type[Gate]) -> list[StateKey]:
    return [
        (machine.name, state.name)
        for machine in config.state_machines
        for state in machine.states
        if isinstance(state, kind)
    ]
