"""The worker's loop: fire clock triggers, claim due work, hand it to slots, sleep.

One process runs one :class:`Worker`. The loop itself never waits on HTTP:
deliveries and feed-reading evaluations run in :class:`Slots`. When a round
finds nothing to do, the loop sleeps in one ``select`` until a label becomes
due (``NOTIFY``), a slot finishes, the next clock job, or the next known due
time, whichever is first (at most ``poll_interval``).
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import schedule
import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Action, Config, Gate
from routemaster.db import claims as work
from routemaster.db.claims import Claim, StateKey
from routemaster.db.errors import Kind, describe_failure
from routemaster.db.notifications import due_listener
from routemaster.http.client import BoundedAdapter
from routemaster.service import resume_ended_pauses
from routemaster.service.bulk import run_batch as run_bulk_batch
from routemaster.service.configuration import apply_migrations
from routemaster.service.scheduling import schedule_unscheduled
from routemaster.service.tasks import expire_leases, forget_old_tasks
from routemaster.service.versions import load_all_versions, worker_triggers, worker_view
from routemaster.worker.delivery import deliver_claim
from routemaster.worker.evaluation import (
    complete_deliveries,
    evaluate_claim,
    evaluate_due_gates,
    move_delivered,
)
from routemaster.worker.outage import OutageLog
from routemaster.worker.receivers import Gatekeeper, Permit
from routemaster.worker.recording import Recorder
from routemaster.worker.retention import prune as prune_retained
from routemaster.worker.slots import Slots
from routemaster.worker.subscriptions import SubscriptionSender
from routemaster.worker.sweeps import Minutely, Sweep
from routemaster.worker.triggers import ClockTriggers
from routemaster.worker.unsent import put_back
from routemaster.worker.upkeep import give_up_on_open_receivers, prune_deliveries

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

OCCURRENCES_FORGET_SECONDS = 60
SCHEDULE_BACKFILL_SECONDS = 10  # rows written without a next check: looked for this often
PRUNE_SECONDS = 60
GIVE_UP_SECONDS = 10


class Worker:
    def __init__(self, app: App, *, rng: random.Random | None = None) -> None:
        self.app = app
        self._rng = rng or random.Random()
        self._stopping = threading.Event()
        # Older versions' states and clock triggers too, for labels of continue machines
        # created under them (SPEC E4): each is scheduled by its own version's gate.
        load_all_versions(app)
        view = worker_view(app)
        # Pull actions (``worker:``) wait for /tasks/claim: never delivered from here.
        self._action_states = [
            key for key in _states_of_kind(view, Action) if not _pulled(view, key)
        ]
        self._gate_states = _states_of_kind(view, Gate)
        self._slots = Slots(app.settings.delivery_concurrency, on_error=app.hooks.exception)
        self._outage = OutageLog()
        self._gate = Gatekeeper(app, self._slots.size, view)
        self._recorder = Recorder()
        self._steps = Steps(app)
        self._receiver_of: dict[tuple[str, str, int], str] = {}  # claims in flight
        self.triggers = ClockTriggers(app, sweep=self._sweep_gate, scheduled=worker_triggers(app))
        self.minutely = Minutely(app, self._sweep)
        self.subscriptions = SubscriptionSender(app, rng=self._rng)
        self._jobs = schedule.Scheduler()
        # Each clock job is a step of its own: one that fails (a statement timeout) is logged and
        # tried again at its next time, never keeping the jobs after it (lease renewal) waiting.
        job = self._job
        self._jobs.every(OCCURRENCES_FORGET_SECONDS).seconds.do(
            job("forgetting old occurrences", self.triggers.forget_old_occurrences)
        )
        self._jobs.every(1).seconds.do(job("clock triggers", self.triggers.fire))
        self._jobs.every(SCHEDULE_BACKFILL_SECONDS).seconds.do(self._wish_backfill)
        self._backfill_wanted = True
        # A third of the lease: two renewals may fail before another worker could take over.
        renew_every = max(1, int(app.settings.lease.total_seconds() / 3))
        self._jobs.every(renew_every).seconds.do(job("renewing leases", self.renew_leases))
        self._jobs.every(PRUNE_SECONDS).seconds.do(
            job("pruning the delivery log", lambda: prune_deliveries(app))
        )
        self._jobs.every(GIVE_UP_SECONDS).seconds.do(
            job("giving up on open receivers", lambda: give_up_on_open_receivers(app, self._gate))
        )
        if any(machine.migrations for machine in app.config.state_machines):
            # Labels a process running the previous configuration moved into a migrated state.
            every = app.settings.migrations_interval  # schedule takes fractions of seconds too
            self._jobs.every(every).seconds.do(  # type: ignore[arg-type]
                job("applying migrations", self.apply_migrations)
            )
        # Pull tasks whose lease ran out are failed attempts (routemaster.service.tasks).
        self._jobs.every(1).seconds.do(job("expiring task leases", self.expire_tasks))
        self._jobs.every(60).seconds.do(job("forgetting old tasks", lambda: forget_old_tasks(app)))
        # Retention: history, deleted and finished labels, bulk jobs (one leader per batch).
        # The clock job only asks; the run is a step of its own (see work_once).
        self._jobs.every(app.settings.retention_interval).seconds.do(  # type: ignore[arg-type]
            self._wish_pruning
        )
        self._pruning_wanted = True
        # Bounded: every webhook and feed call has one total deadline (routemaster.http).
        adapter = BoundedAdapter(pool_connections=self._slots.size, pool_maxsize=self._slots.size)
        app.http.mount("http://", adapter)
        app.http.mount("https://", adapter)

    @property
    def in_flight(self) -> int:
        """Deliveries and feed-reading evaluations held by slots now."""
        return len(self._slots.held())

    def stop(self) -> None:
        """Stop claiming and sending; :meth:`run` returns once in-flight work is recorded.

        Safe from a signal handler: it only sets a flag and writes to a pipe.
        """
        self._stopping.set()
        self._slots.wake()
        self.subscriptions.stop_sending()

    def run(self) -> None:
        logger.info(
            "worker %s started: %d action states, %d clock triggers",
            self.app.settings.worker_id,
            len(self._action_states),
            len(self.triggers.triggers),
        )
        metrics = self.app.metrics
        listener = due_listener(
            self.app.direct or self.app.db,
            self.app.db,
            on_change=None if metrics is None else metrics.listening("worker"),
        )
        first = True
        self.subscriptions.start()
        try:
            # Stopping, the loop goes on only to record (and lease) what is still in flight.
            while not self._stopping.is_set() or self._slots.held():
                try:
                    if first:
                        self._steps.run("clock jobs", self._jobs.run_all, None)
                        first = False
                    busy = self.work_once()
                    sleep = 0.0 if busy else self._sleep_for()
                    self._outage.up()
                except sa.exc.SQLAlchemyError as error:
                    self._outage.down(error)
                    busy, sleep = False, self.app.settings.poll_interval
                except Exception:
                    self.app.hooks.exception("the worker loop failed")
                    raise
                if not busy:
                    listener.wait(sleep, [self._slots.wake_fd])
                    self._slots.clear_wake()
        finally:
            logger.info("worker %s stopping", self.app.settings.worker_id)
            self._slots.shutdown()
            self.subscriptions.stop()
            try:
                self._complete(self._slots.take_done())
                self._gate.release()
            except sa.exc.SQLAlchemyError:
                logger.warning("could not record the last deliveries; they will be sent again")
            listener.close()
            logger.info("worker %s stopped", self.app.settings.worker_id)

    def work_once(self) -> bool:
        """One round: clock jobs, finished deliveries, new claims, due gates; whether any work.

        Each piece of work is its own step: a statement of one that fails (a
        statement timeout, a conflict) is logged and tried again next round,
        and the others go on. Only an unreachable database stops the round.
        Once :meth:`stop` is called nothing new is claimed or sent: a round only
        records what slots finished, and work claimed meanwhile is given back.
        """
        step = self._steps.run
        step("clock jobs", self._jobs.run_pending, None)
        if self.triggers.next_interval_at and self.app.now() >= self.triggers.next_interval_at:
            step("clock triggers", self.triggers.fire, None)
        step("1.x jobs", self.minutely.run_pending, None)
        delivered = self._slots.take_done()
        if self._stopping.is_set():
            return step("moving delivered labels", lambda: self._complete(delivered), False)
        # Labels whose move failed in an earlier round, in a step of their own: a move that
        # keeps failing holds up no claim.
        completed = step("moving delivered labels", self._complete, False)
        # The labels delivered since the last round move on in the claim's transaction.
        claimed = step(
            "claiming deliveries", lambda: self._claim_deliveries(delivered=delivered), False
        )
        if self._stopping.is_set():
            return bool(completed or claimed)
        evaluated = step("evaluating due gates", self._evaluate_due_gates, 0)
        # Bulk commands: one batch a round, so deliveries and gates are never kept waiting.
        carried_out = step(
            "bulk commands", lambda: run_bulk_batch(self.app, limit=self.app.settings.batch_size), 0
        )
        scheduled = step("computing next checks", self._backfill, 0)
        step("pruning", self._prune, None)
        return bool(completed or claimed or evaluated or carried_out or scheduled)

    def _evaluate_due_gates(self) -> int:
        evaluated, waiting = evaluate_due_gates(
            self.app, self._gate_states, limit=self.app.settings.batch_size
        )
        self._evaluate(waiting)
        return evaluated

    def _job(self, name: str, work: Callable[[], object]) -> Callable[[], None]:
        """A clock job run as a step: a statement of it that fails is logged, not raised."""

        def run() -> None:
            self._steps.run(name, work, None)

        return run

    def _wish_backfill(self) -> None:
        self._backfill_wanted = True

    def _backfill(self) -> int:
        """Next checks for rows written without one, a batch a round while any are found."""
        if not self._backfill_wanted:
            return 0
        limit = self.app.settings.batch_size
        done = schedule_unscheduled(self.app, limit=limit)
        self._backfill_wanted = done >= limit
        if done and self.app.metrics is not None:
            self.app.metrics.scheduled_late.inc(done)
        return done

    def _wish_pruning(self) -> None:
        self._pruning_wanted = True

    def _prune(self) -> None:
        """Retention's pruning run, once per ``retention_interval``.

        The wish is taken before the run: a run that fails (a statement
        timeout) is not repeated every round but waits for the next interval,
        so it never slows the loop down more than once an interval.
        """
        if not self._pruning_wanted:
            return
        self._pruning_wanted = False
        prune_retained(self.app)

    def renew_leases(self) -> None:
        """Keep every claim in flight leased, however long its receiver takes."""
        held = self._slots.held()
        if held:
            with self.app.db.begin() as conn:
                work.extend_leases(
                    conn,
                    held,
                    lease_until=self.app.now() + self.app.settings.lease,
                    worker_id=self.app.settings.worker_id,
                )

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
        except sa.exc.SQLAlchemyError:
            raise  # the database is away: the loop waits for it
        except Exception:
            logger.exception("applying the configuration's migrations failed")
            self.app.hooks.exception("applying the configuration's migrations failed")

    def _sweep(self, sweep: Sweep) -> None:
        """One of 1.x's minutely jobs (:mod:`~routemaster.worker.sweeps`)."""
        if isinstance(sweep.state, Action):
            self._claim_deliveries([sweep.key])
        else:
            self._sweep_gate(sweep.key)

    def _sweep_gate(self, gate: StateKey) -> None:
        """Evaluate one gate's due labels now (those reading feeds go to slots)."""
        if self._stopping.is_set():
            return
        _, waiting = evaluate_due_gates(self.app, [gate], limit=self.app.settings.batch_size)
        self._evaluate(waiting)

    def _claim_deliveries(
        self, states: list[StateKey] | None = None, *, delivered: Sequence[Claim] = ()
    ) -> bool:
        """Claim as many due deliveries as there are free slots (any free slot is used);
        whether anything was claimed or moved.

        The claim's transaction first moves the ``delivered`` labels on and writes
        their calls' log entries: one transaction a round, the log never behind.
        """
        states = self._action_states if states is None else states
        free = self._slots.free
        if free <= 0 or not states or self._stopping.is_set():
            return self._complete(delivered)
        held = self._slots.held()
        receiver_of = self._receiver_of
        for entry in set(receiver_of) - {claim.entry for claim in held}:
            del receiver_of[entry]
        in_flight = Counter(receiver_of.values())
        if self._recorder.take_failures():
            self._gate.invalidate()
        taken = self._recorder.take(delivered)
        waiting: list[Claim] = []

        def complete(conn: sa.Connection, now: datetime.datetime) -> None:
            claims, entries = [c for c, _ in taken], [e for _, e in taken]
            waiting.extend(move_delivered(conn, self.app, claims, entries, self._gate.answered))

        try:
            claimed = self._gate.claim(
                free, in_flight, complete, states=None if states is self._action_states else states
            )
        except Exception:
            self._recorder.restore(taken)  # written with the next round's
            raise
        self._evaluate(waiting)
        if self._stopping.is_set():  # the signal came during the claim: none of it is sent
            put_back(self.app, deliveries=claimed)
            return bool(taken)
        for claim, permit in claimed:
            receiver_of[claim.entry] = permit.receiver.id
            self._slots.submit(claim, self._delivery(permit))
        return bool(claimed or taken)

    def _delivery(self, permit: Permit) -> Callable[[Claim], bool]:
        def deliver(claim: Claim) -> bool:
            if self._stopping.is_set():  # stopped between the claim and this slot
                put_back(self.app, deliveries=[(claim, permit)])
                return False
            return deliver_claim(self.app, claim, self._rng, permit, self._recorder)

        return deliver

    def _complete(self, delivered: Sequence[Claim] = ()) -> bool:
        """Move ``delivered`` labels, and those whose move failed before, on and write their
        calls' log entries, in a transaction of their own; whether there were any."""
        taken = self._recorder.take_unwritten() + self._recorder.take(delivered)
        if not taken:
            return False
        try:
            claims, entries = [c for c, _ in taken], [e for _, e in taken]
            waiting = complete_deliveries(self.app, claims, entries, self._gate.answered)
        except Exception:
            self._recorder.restore(taken)  # written with the next round's
            raise
        self._evaluate(waiting)
        return True

    def _evaluate(self, waiting: list[Claim]) -> None:
        if self._stopping.is_set():
            put_back(self.app, gates=waiting)
            return
        for claim in waiting:
            self._slots.submit(claim, self._evaluation)

    def _evaluation(self, claim: Claim) -> bool:
        if self._stopping.is_set():  # stopped between the lease and this slot
            put_back(self.app, gates=[claim])
            return False
        return evaluate_claim(self.app, claim)

    def _sleep_for(self) -> float:
        """Until the next clock job, interval occurrence or known due time; at most a poll."""
        timeout = self.app.settings.poll_interval
        now = self.app.now()
        until_job = self._jobs.idle_seconds
        if until_job is not None:
            timeout = min(timeout, max(until_job, 0.0))
        if self._gate.wake_at is not None:  # a receiver's rate or cooldown: past means now
            timeout = min(timeout, max((self._gate.wake_at - now).total_seconds(), 0.0))
        wakes = [self.triggers.next_interval_at]
        with self.app.db.connect() as conn:
            wakes.append(work.next_due_at(conn))
        for wake in wakes:
            # A due time already past belongs to work another worker holds or this one
            # cannot take (a state it does not know): it must not make the loop spin.
            if wake is not None and wake > now:
                timeout = min(timeout, (wake - now).total_seconds())
        return timeout


class Steps:
    """Runs the loop's pieces of work so that one failing statement never stalls the rest."""

    def __init__(self, app: App) -> None:
        self._app = app

    def run(self, name: str, work: Callable[[], _T], failed: _T) -> _T:
        """``work()``, or ``failed`` when its statement failed without the database being away.

        An unreachable database (or no pooled connection) is raised: the loop
        waits for it. Anything else the database answered (a statement
        timeout, a conflict) is logged as what it is and the step is tried
        again next round.
        """
        try:
            return work()
        except sa.exc.SQLAlchemyError as error:
            failure = describe_failure(error)
            if failure.kind in (Kind.UNREACHABLE, Kind.BUSY):
                raise
            if failure.kind is Kind.TIMEOUT:
                logger.error("statement timeout while %s; tried again: %s", name, failure.detail)
            else:
                logger.error("%s failed; tried again: %s", name, failure.log_line())
            if self._app.metrics is not None and failure.kind is Kind.TIMEOUT:
                self._app.metrics.statement_timeouts.labels(name).inc()
            return failed


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
