"""Pull workers (SPEC D1): claiming labels in ``worker:`` actions and finishing them by task id.

A claim leases due labels to a worker under a fresh, unguessable task id.
The id is the capability for everything after: heartbeat (extend the
lease), complete (merge metadata, then leave the action exactly as a
delivered webhook does), fail (retry with the action's backoff, or error),
release (due again, no attempt counted). Each of those first ends or
extends the lease in one fenced statement (:mod:`routemaster.db.tasks`), so
a stale id answers :class:`LeaseLost` and changes nothing. A lease that runs
out is a failed attempt (:func:`expire_leases`).
"""

from __future__ import annotations

import datetime
import random
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Action, Config, StateMachine
from routemaster.db import (
    counts,
    label_claims,
    schedules,
    task_records,
    transitions,
)
from routemaster.db import labels as store
from routemaster.db import tasks as task_store
from routemaster.db.labels import Label
from routemaster.db.notifications import notify_due
from routemaster.db.tasks import Expiry
from routemaster.db.tasks import PullState as PullState  # for the faces
from routemaster.db.tasks import Task as Task  # for the faces
from routemaster.machine.planning import Plan
from routemaster.machine.retry import backoff
from routemaster.service.flow_claims import claim_flow_tasks, flow_states
from routemaster.service.labels import (
    Settled,
    advance_locked,
    advance_with_feeds,
    finish_in_request,
    get_label,
    settle_batch,
)
from routemaster.service.leases import LeaseBook
from routemaster.service.shard_moves import again_if_moved
from routemaster.service.transactions import read, reading, task_writing, writing
from routemaster.service.versions import machine_for

EXPIRE_BATCH = 100
RAN_OUT = "the lease ran out without a heartbeat"
AT_MOST_ONCE_RAN_OUT = "lease ran out (at most once)"


class TaskNotFound(Exception):
    """No task with this id was ever issued."""


class LeaseLost(Exception):
    """The task's lease is over: run out, ended by complete/fail/release, or the label moved."""


class NoSuchPullState(Exception):
    """A claim named a state that is not a pull action (say which)."""


def pull_states(
    config: Config, state_machine: str | None = None, state: str | None = None
) -> list[PullState]:
    """The pull actions a claim may take from: (state machine, state).

    ``NoSuchPullState`` when ``state`` is given and no machine in scope has
    a pull action of that name.
    """
    found = [
        (machine.name, action.name)
        for machine in config.state_machines
        if state_machine is None or machine.name == state_machine
        for action in machine.states
        if isinstance(action, Action) and action.worker is not None
        if state is None or action.name == state
    ]
    if state is not None and not found:
        raise NoSuchPullState(f"no pull action (worker:) called {state!r}")
    return found


def new_task_id() -> str:
    """An unguessable, URL-safe id (192 random bits)."""
    return secrets.token_urlsafe(24)


def claim_tasks(
    app: App,
    states: Sequence[PullState],
    *,
    worker: str,
    limit: int,
    rng: random.Random,
    expire: bool = True,
    leases: LeaseBook | None = None,
) -> list[Task]:
    """Lease up to ``limit`` due labels in ``states`` to ``worker``, oldest due first.

    With ``expire``, leases that ran out in those states are counted as
    failed attempts first (the worker loop also does so every second). Each
    state's lease is chosen now (:mod:`routemaster.service.leases`), from
    durations ``leases`` kept if given.
    """
    now = app.now()

    def claiming() -> list[Task]:
        with writing(app) as conn:
            if expire:
                _expire(conn, app, states, now, rng)
            leased = (leases or LeaseBook()).leases(conn, app.config, states, now=now)
            ids = [new_task_id() for _ in range(limit)]
            by_flow = flow_states(app.config)
            claimed = claim_flow_tasks(conn, by_flow, leased, ids, worker=worker, now=now)
            return claimed + label_claims.claim_tasks(
                conn,
                [item for item in leased if (item[0], item[1]) not in by_flow],
                ids=ids[len(claimed) :],
                worker=worker,
                now=now,
            )

    claimed = again_if_moved(claiming)  # on Citus: a shard moved meanwhile (service/shard_moves)
    for task in claimed:
        _event(app, task.state_machine, task.state, task.label, "claimed")
    return claimed


def expire_leases(app: App, rng: random.Random) -> int:
    """Count run-out leases in every pull action as failed attempts; how many there were."""
    states = pull_states(app.config)
    if not states:
        return 0
    with writing(app) as conn:
        return _expire(conn, app, states, app.now(), rng)


def forget_old_tasks(app: App, *, limit: int = 10_000) -> int:
    """Delete tasks older than ``task_retention`` (never a label's current one); how many."""
    with writing(app) as conn:
        return task_records.forget_before(
            conn, app.now() - app.settings.task_retention, limit=limit
        )


def heartbeat(app: App, task_id: str) -> datetime.datetime:
    """Extend the task's lease by its length from now; the new expiry."""
    with writing(app) as conn:
        expires = task_store.heartbeat(conn, task_id, now=app.now())
        if expires is None:
            raise _refusal(conn, task_id)
    return expires


def complete(app: App, task_id: str, patch: dict[str, Any] | None) -> Label:
    """Merge ``patch`` into the metadata and move the label on, as a delivered webhook does."""
    now = app.now()

    def completing() -> tuple[StateMachine, str, Label, Plan]:
        with task_writing(app, task_id) as conn:
            label = _take(conn, task_id, "completed", now)
            action_state = label.state
            machine = app.config.get_machine(label.state_machine)
            if patch:
                merged = transitions.merge_metadata(
                    conn, label.state_machine, label.name, patch, now=now
                )
                label = merged or label
            label, plan = advance_locked(conn, app, machine, label, now=now)
            if not plan.moves and plan.feed_missing is None:
                schedules.clear_due(conn, [label.key])  # an action with no next: it rests here
                label = store.get(conn, label.state_machine, label.name) or label
            _slot_freed(conn, app, [(machine.name, action_state)])
        return machine, action_state, label, plan

    machine, action_state, label, plan = again_if_moved(completing)
    _event(app, machine.name, action_state, label.name, "completed")
    return finish_in_request(app, machine, label, plan)


def _slot_freed(conn: sa.Connection, app: App, states: Sequence[PullState]) -> None:
    """A task of an action with a flow ended: its key's slot is free, so waiting claims
    (and workers) are woken to take the key's next label (SPEC G2: work-conserving)."""
    if any(state in flow_states(app.config) for state in states):
        notify_due(conn)


@dataclass(frozen=True)
class Completed:
    """One completion of a batch: the label moved on, or why the task id was refused."""

    task_id: str
    label: Label | None
    refusal: TaskNotFound | LeaseLost | None


def complete_many(
    app: App, completions: Sequence[tuple[str, dict[str, Any] | None]]
) -> list[Completed]:
    """Complete many tasks in one transaction, each fenced as :func:`complete` is; in order.

    Each answer is what :func:`complete` alone would have given, called in
    the same order: an id given twice is completed once, then refused.
    Leases are ended and metadata merged in one statement, and the labels
    planned together and moved in one more (:func:`settle_batch`); those whose
    next evaluation reads a feed are evaluated after the commit, as a single
    completion's are.
    """
    now = app.now()
    first: dict[str, dict[str, Any] | None] = {}
    for task_id, patch in completions:
        first.setdefault(task_id, patch)

    def completing() -> tuple[dict[str, Label], set[str], Settled]:
        with writing(app) as conn:
            taken = transitions.complete_tasks(conn, list(first.items()), now=now)
            issued = task_records.issued_among(conn, [i for i in first if i not in taken])
            settled = settle_batch(conn, app, list(taken.values()), now=now)
            schedules.settle_unmoved(conn, settled.unmoved)
            for label in settled.waiting:
                schedules.mark_due(conn, label.key, at=now + app.settings.evaluation_retry_delay)
            states = [(label.state_machine, label.state) for label in taken.values()]
            _slot_freed(conn, app, states)
        return taken, issued, settled

    taken, issued, settled = again_if_moved(completing)
    resting = {schedule.key: schedule for schedule in settled.unmoved}
    moved: dict[str, Label] = {}
    for task_id, label in taken.items():
        _event(app, label.state_machine, label.state, label.name, "completed")
        current = settled.labels[label.key]
        rest = resting.get(label.key)
        if rest is not None:  # an action with no next: the label rests there
            current = replace(current, due_at=rest.due_at, attempts=0, last_error=None)
        moved[task_id] = current
    task_of = {label.key: task_id for task_id, label in taken.items()}
    for label in settled.waiting:  # feeds fetched now, with no transaction open
        machine = app.config.get_machine(label.state_machine)
        moved[task_of[label.key]] = advance_with_feeds(
            app, label.key, label.entry_id, timeout=app.settings.feed_timeout_in_request
        ) or get_label(app, machine, label.name)
    answers = []
    for task_id, _ in completions:
        done = moved.pop(task_id) if task_id in moved else None  # the same id again: refused
        refusal = None if done else _refused(task_id, task_id in issued or task_id in taken)
        answers.append(Completed(task_id, done, refusal))
    return answers


@dataclass(frozen=True)
class NextClaim:
    """The claim a batch completion makes after it: a ``/tasks/claim`` body, checked."""

    states: list[PullState]
    worker: str
    limit: int


def complete_and_claim(
    app: App,
    completions: Sequence[tuple[str, dict[str, Any] | None]],
    then: NextClaim | None,
    *,
    rng: random.Random,
    expire: bool,
    leases: LeaseBook,
) -> tuple[list[Completed], list[Task]]:
    """``POST /tasks/complete``: :func:`complete_many`, then the claim ``then`` if given.

    The claim comes after the completions' commit, so it may take the labels
    they moved into another pull action.
    """
    done = complete_many(app, completions)
    if then is None:
        return done, []
    claimed = claim_tasks(
        app,
        then.states,
        worker=then.worker,
        limit=then.limit,
        rng=rng,
        expire=expire,
        leases=leases,
    )
    return done, claimed


class PullClaims:
    """This process's pull claims, made now: the state every claim of the process shares (a
    random source for backoffs, the percentile leases' recent durations, when run-out leases
    were last ended). The API makes a claim here; only a claim that found nothing and may
    wait is handed to the claim waiter (:mod:`routemaster.hubs.claim_waits`), which claims
    here again for it.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self.rng = random.Random()
        self.leases = LeaseBook()
        self._lock = threading.Lock()
        self._expired_at: datetime.datetime | None = None

    def expiry_due(self) -> bool:
        """Whether a claim should first end the leases that ran out: at most once per
        poll interval of the app's clock in this process, so a busy API does not pay one
        more statement per claim (the worker loop ends them every second anyway)."""
        now = self.app.now()
        with self._lock:
            last = self._expired_at
            if (
                last is not None
                and abs((now - last).total_seconds()) < self.app.settings.poll_interval
            ):
                return False
            self._expired_at = now
            return True

    def claim(self, claim: NextClaim) -> list[Task]:
        """The claim made now: the tasks it takes (maybe none)."""
        return claim_tasks(
            self.app,
            claim.states,
            worker=claim.worker,
            limit=claim.limit,
            rng=self.rng,
            expire=self.expiry_due(),
            leases=self.leases,
        )

    def complete_and_claim(
        self, completions: Sequence[tuple[str, dict[str, Any] | None]], then: NextClaim | None
    ) -> tuple[list[Completed], list[Task]]:
        """Complete tasks in order, then make the claim ``then`` now (if there is one)."""
        return complete_and_claim(
            self.app,
            completions,
            then,
            rng=self.rng,
            expire=then is not None and self.expiry_due(),
            leases=self.leases,
        )


def fail(
    app: App,
    task_id: str,
    *,
    error: str,
    retry: bool,
    retry_after: float | None,
    rng: random.Random,
) -> Label:
    """A failed attempt: due again after ``retry_after`` or the backoff, or errored.

    Errored at once when ``retry`` is false (as a 410 does), or when this was
    the action's last attempt.
    """
    now = app.now()
    with writing(app) as conn:
        label = _take(conn, task_id, "failed", now)
        policy = _action(app, label).retry
        if not retry or label.attempts >= policy.max_attempts:
            why = "gave up" if not retry else f"attempt {label.attempts} of {policy.max_attempts}"
            label = task_store.give_up(conn, label, error=f"{error} ({why})", now=now)
        else:
            delay = (
                datetime.timedelta(seconds=retry_after)
                if retry_after is not None
                else backoff(policy, label.attempts, rng)
            )
            label = task_store.set_due(conn, label, due_at=now + delay, now=now, error=error)
            if not delay:
                notify_due(conn)
    _event(app, label.state_machine, label.state, label.name, "failed")
    return label


def release(app: App, task_id: str) -> Label:
    """Give the label back: due again at once, the attempt not counted."""
    now = app.now()
    with writing(app) as conn:
        label = _take(conn, task_id, "released", now)
        label = task_store.set_due(
            conn,
            label,
            due_at=now,
            now=now,
            error=label.last_error,
            attempts=max(label.attempts - 1, 0),
        )
        notify_due(conn)
    _event(app, label.state_machine, label.state, label.name, "released")
    return label


def open_callback_task(
    app: App, key: tuple[str, str], entry_id: int, *, holder: str, timeout: datetime.timedelta
) -> str | None:
    """A task id for a webhook about to be sent with ``async_timeout`` (``Routemaster-Task``).

    It is valid from now, so a completion that arrives before the 202 counts.
    ``None`` if ``holder`` no longer holds the label in that entry.
    """
    task_id = task_store.labelled_task_id(key[1], new_task_id())
    with writing(app) as conn:
        opened = task_store.open_callback(
            conn,
            key,
            entry_id=entry_id,
            task_id=task_id,
            holder=holder,
            lease_seconds=timeout.total_seconds(),
            now=app.now(),
        )
    return task_id if opened else None


def _take(conn: sa.Connection, task_id: str, outcome: str, now: datetime.datetime) -> Label:
    taken = task_store.end_task(conn, task_id, outcome=outcome, now=now)
    if taken is None:
        raise _refusal(conn, task_id)
    return taken[0]


def _refusal(conn: sa.Connection, task_id: str) -> Exception:
    return _refused(task_id, task_store.issued(conn, task_id))


def _refused(task_id: str, issued: bool) -> TaskNotFound | LeaseLost:
    if issued:
        return LeaseLost(
            "This task's lease is over (it ran out, the task was completed, failed or "
            "released, or the label left the action): another worker may hold the label now."
        )
    return TaskNotFound(f"No task {task_id!r} was ever issued.")


def _expire(
    conn: sa.Connection,
    app: App,
    states: Sequence[tuple[str, str]],
    now: datetime.datetime,
    rng: random.Random,
) -> int:
    held = label_claims.lock_expired_tasks(conn, states, now=now, limit=EXPIRE_BATCH)
    expiries = []
    for lease in held:
        action = app.config.get_machine(lease.state_machine).get_state(lease.state)
        assert isinstance(action, Action)
        policy = action.retry
        if action.worker is not None and action.worker.at_most_once:
            # The work may have run: never offer it again, whatever ``retry`` says.
            expiries.append(Expiry(lease, None, AT_MOST_ONCE_RAN_OUT))
            continue
        due = (
            None
            if lease.attempts >= policy.max_attempts
            else now + backoff(policy, lease.attempts, rng)
        )
        expiries.append(Expiry(lease, due, RAN_OUT))
    task_store.expire(conn, expiries, now=now)
    for lease in held:
        _event(app, lease.state_machine, lease.state, lease.name, "expired")
    return len(held)


def _action(app: App, label: Label) -> Action:
    action = (machine_for(app, label) or app.config.get_machine(label.state_machine)).get_state(
        label.state
    )
    assert isinstance(action, Action), "tasks are only issued for labels in actions"
    return action


def _event(app: App, state_machine: str, state: str, label: str, event: str) -> None:
    app.hooks.task_event(state_machine=state_machine, state=state, label=label, event=event)


tasks_of_label = read(task_records.of_label)
"""A label's latest tasks (machine, name), oldest first."""


def tasks_in_flight(app: App) -> dict[tuple[str, str], int]:
    """Tasks holding labels now, per (state machine, action state)."""
    with reading(app) as conn:
        return counts.tasks_in_flight_per_state(conn, now=app.now())
