"""Creating, updating, deleting and advancing labels: the store, the planner and feeds together.

Every move is decided by :func:`routemaster.machine.plan_moves` and written
by :func:`routemaster.db.transitions.write_moves`, in one short transaction. When
an evaluation reads a feed, the plan says so instead of waiting: the feeds
are then fetched with no transaction open (:func:`advance_with_feeds`), and
the moves they allow are written in one more transaction, if the label is
still in the entry that was evaluated.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Action, Gate, State, StateMachine
from routemaster.db import labels as store
from routemaster.db import schedules, transitions
from routemaster.db.labels import HistoryEntry, Label, LabelKey, Moves
from routemaster.db.schedules import Schedule
from routemaster.exit_conditions import Context
from routemaster.machine import Plan, evaluates_on_entry, plan_moves, update_fires
from routemaster.machine.planning import FeedReader, context_for, no_feeds
from routemaster.service.child_words import note_deleted, note_finished
from routemaster.service.feeds import FeedFetcher
from routemaster.service.refusals import LabelDeleted, LabelExists, LabelNotFound
from routemaster.service.scheduling import (
    after_evaluation_of,
    arrival,
    plan_input_of,
    scheduled_states_of_versions,
    store_after_update,
)
from routemaster.service.transactions import (
    label_writing,
    one_label_read,
    one_label_write,
    one_statement,
)
from routemaster.service.versions import machine_for


def create_label(app: App, machine: StateMachine, name: str, metadata: dict[str, Any]) -> Label:
    """Create ``name`` in the machine's first state; ``LabelExists`` if the name is taken.

    As in 1.x, the first state is evaluated at once only if it has an entry trigger.
    """
    now = app.now()
    initial = machine.initial_state
    # New labels take the version in force (``machine``); only continue and abort machines
    # keep it.
    version = app.versions.in_force.get(machine.name) if machine.keeps_versions else None
    due_at, next_check_at = arrival(
        app, machine, name, metadata, state=initial.name, previous_state=None, now=now
    )

    def insert(conn: sa.Connection) -> Label | None:
        return transitions.insert(
            conn,
            machine.name,
            name,
            metadata,
            state=initial.name,
            now=now,
            due_at=due_at,
            next_check_at=next_check_at,
            version=version,
        )

    if not isinstance(initial, Action) and not evaluates_on_entry(initial):
        # The insert is all there is to do: one statement, its own transaction (two on Citus).
        with one_label_write(app, name) as conn:
            created = insert(conn)
        if created is None:
            raise LabelExists(name)
        return created
    with label_writing(app, name) as conn:
        label = insert(conn)
        if label is None:
            raise LabelExists(name)
        if not evaluates_on_entry(initial):
            return label
        label, plan = advance_locked(conn, app, machine, label, now=now)
    return finish_in_request(app, machine, label, plan)


def get_label(app: App, machine: StateMachine, name: str) -> Label:
    with one_label_read(app, name) as conn:
        label = store.get(conn, machine.name, name)
    if label is None:
        raise LabelNotFound(name)
    return label


def update_metadata(app: App, machine: StateMachine, name: str, patch: dict[str, Any]) -> Label:
    """Deep-merge ``patch`` into the metadata; evaluate the gate if the update fires a trigger.

    The metadata write commits even if the evaluation then fails (a feed is
    down): the label is marked due so the worker retries the evaluation. A
    paused label is not evaluated, but the evaluation is owed: it is marked
    due, and the worker evaluates it once the label is resumed.
    """
    now = app.now()
    # Gates evaluated at moments in any version a label of the machine may follow (SPEC E4).
    scheduled = scheduled_states_of_versions(app, machine)
    with label_writing(app, name) as conn:
        label = _merged(conn, machine, name, patch, scheduled, now=now)
        # The definition that governs it: its own version's, on a continue machine. A state it
        # lacks (a newer one's, in a rolling deploy), or a version not found: not evaluated.
        governing = machine_for(app, label)
        state = _state_of(governing, label) if governing is not None else None
        if label.errored or governing is None or state is None:
            return label
        fires = update_fires(state, patch)
        if label.state in scheduled and (label.paused or not fires):
            # The metadata a waiting label's next check was solved from has changed.
            store_after_update(conn, app, governing, label)
        if not fires:
            return label
        if label.paused:
            schedules.mark_due(conn, label.key, at=now)
            return label
        label, plan = advance_locked(conn, app, governing, label, now=now)
    return finish_in_request(app, governing, label, plan)


def _merged(
    conn: sa.Connection,
    machine: StateMachine,
    name: str,
    patch: dict[str, Any],
    scheduled: list[str],
    *,
    now: datetime.datetime,
) -> Label:
    """The label with ``patch`` merged in; ``LabelNotFound`` or ``LabelDeleted`` if it cannot be.

    Each statement reads its own snapshot (READ COMMITTED), so when the merge
    finds no live label, the look that says why can see a label whose create
    committed in between: there and not deleted. The merge saw no label at
    all then, and is run again, in a newer snapshot. If that one finds
    nothing either, the label was deleted since (only a delete hides a label
    from the merge, and a deleted label stays deleted).
    """
    label = transitions.merge_metadata(
        conn, machine.name, name, patch, now=now, scheduled_states=scheduled
    )
    if label is not None:
        return label
    deleted = store.is_deleted(conn, machine.name, name)
    if deleted is None:
        raise LabelNotFound(name)
    if deleted:
        raise LabelDeleted(name)
    label = transitions.merge_metadata(
        conn, machine.name, name, patch, now=now, scheduled_states=scheduled
    )
    if label is None:
        raise LabelDeleted(name)
    return label


def delete_label(app: App, machine: StateMachine, name: str) -> None:
    """Soft-delete: clear metadata, record it in history, keep the name taken."""
    with _deleting(app, machine, name) as conn:
        old_state = transitions.soft_delete(conn, machine.name, name, now=app.now())
        if old_state is not None:
            note_deleted(conn, app.config, [(machine.name, name)])  # a child counts as failed
    if old_state is not None:
        log_transition(app, machine.name, name, old_state, None, forced=False)


def _deleting(app: App, machine: StateMachine, name: str) -> AbstractContextManager[sa.Connection]:
    """A deletion's connection: a transaction when the label may be a child (its outcome and
    its word for its parent go with the deletion, beside it), else :func:`one_label_write`'s."""
    if machine.name in app.config.child_machines:
        return label_writing(app, name)
    return one_label_write(app, name)


def history(app: App, machine: StateMachine, name: str) -> list[HistoryEntry]:
    with one_label_read(app, name) as conn:
        return store.history(conn, machine.name, name)


def label_context(app: App, machine: StateMachine, label: Label, feed_timeout: float) -> Context:
    """The evaluation context for ``label`` now, fetching feeds over HTTP as they are read."""
    fetcher = FeedFetcher(app, machine, label.name, state=label.state, timeout=feed_timeout)
    return context_for(plan_input_of(label), app.now(), fetcher.read)


def advance_locked(
    conn: sa.Connection,
    app: App,
    machine: StateMachine,
    label: Label,
    *,
    now: datetime.datetime,
) -> tuple[Label, Plan]:
    """Evaluate the locked ``label`` and write its moves; the label as written, and the plan.

    Feeds are not fetched here (a transaction is open): a plan that needs
    them says so, for the caller to fetch them once the transaction is over.
    The label is evaluated, and scheduled where it stops, by the definition that
    governs it (its own version's, on a ``continue`` machine; none: left alone).
    """
    governing = machine_for(app, label) if label.state_machine == machine.name else machine
    if governing is None:
        return label, Plan()
    machine = governing
    plan = _plan(app, machine, label, now, no_feeds)
    if plan.moves:
        label = write(conn, app, [moves_for(app, machine, label, plan, now)], now=now)[0]
    elif plan.feed_missing is not None:
        # A safety net: if the feeds are never fetched (the process dies), the worker retries.
        schedules.mark_due(conn, label.key, at=due_at(app, plan, now) or now)
    elif isinstance(_state_of(machine, label), Gate):
        settled = after_evaluation_of(app, machine, label, now)
        schedules.settle_unmoved(conn, [settled])
        label = replace(label, due_at=settled.due_at, attempts=0, last_error=None)
    return label, plan


def advance(
    app: App, machine: StateMachine, name: str, *, entry_id: int | None = None
) -> Label | None:
    """Evaluate the label's current state now and move it as far as it goes.

    In a gate, the exit condition decides; in an action, it means the webhook
    was delivered and the label leaves. ``None`` when the label is deleted,
    paused, errored, or no longer in entry ``entry_id``.
    """
    if entry_id is None:
        entry_id = get_label(app, machine, name).entry_id
    return advance_with_feeds(
        app, (machine.name, name), entry_id, timeout=app.settings.feed_timeout
    )


def advance_with_feeds(app: App, key: LabelKey, entry_id: int, *, timeout: float) -> Label | None:
    """Evaluate the label's current state, reading feeds over HTTP with no transaction open.

    The label is planned from a snapshot while feeds are fetched as the
    evaluation reads them; then, in one transaction, it is locked and moved if
    it is still in entry ``entry_id`` (planned again on the stored metadata if
    an update came in meanwhile). ``None`` when the label had moved on, or
    was deleted, paused or errored. A feed that fails leaves the label where
    the plan stopped, due again after ``evaluation_retry_delay``.
    """
    with one_statement(app) as conn:
        snapshot = store.get(conn, *key)
    if snapshot is None or not snapshot.live or snapshot.entry_id != entry_id:
        return None
    machine = machine_for(app, snapshot)
    if machine is None:
        return None  # a version this process cannot find: left alone
    now = app.now()
    fetcher = FeedFetcher(app, machine, key[1], state=snapshot.state, timeout=timeout)
    plan = _plan(app, machine, snapshot, now, fetcher.read)
    with label_writing(app, key[1]) as conn:
        label = store.lock(conn, *key)
        if label is None or not label.live or label.entry_id != entry_id:
            return None
        if label.version != snapshot.version:  # upgraded meanwhile (a bulk upgrade)
            machine = machine_for(app, label)
            if machine is None:
                return None
        if label.metadata != snapshot.metadata or label.version != snapshot.version:
            plan = _plan(app, machine, label, now, fetcher.fetched)
        if plan.moves:
            label = write(conn, app, [moves_for(app, machine, label, plan, now)], now=now)[0]
        if plan.feed_missing is not None:
            retry_at = now + app.settings.evaluation_retry_delay
            error = str(plan.feed_missing)
            schedules.record_evaluation_failure(conn, label.key, error=error, due_at=retry_at)
            return replace(label, due_at=retry_at, last_error=error)
        if not plan.moves:
            settled = after_evaluation_of(app, machine, label, now)
            schedules.settle_unmoved(conn, [settled])
            label = replace(label, due_at=settled.due_at, attempts=0, last_error=None)
        return label


@dataclass(frozen=True)
class Settled:
    """What :func:`settle_batch` did with a batch of locked labels."""

    unmoved: list[Schedule]  # evaluated: nothing to do until their next due time
    waiting: list[Label]  # their next evaluation reads feeds, as they are now
    labels: dict[LabelKey, Label]  # every label of the batch, as written


def settle_batch(
    conn: sa.Connection, app: App, batch: Sequence[Label], *, now: datetime.datetime
) -> Settled:
    """Evaluate many locked labels and write all their moves in one statement.

    The worker's fast path for due gates and delivered actions: decisions
    are pure Python and the writes one round trip, however many labels
    move. Labels whose evaluation reads a feed come back in ``waiting``,
    after the moves they could make without one.
    """
    plans = [
        (label, machine, _plan(app, machine, label, now, no_feeds) if found else Plan())
        for label in batch
        for found in [machine_for(app, label)]
        # a version this process cannot find: not moved, scheduled as the configuration says
        for machine in [found or app.config.get_machine(label.state_machine)]
    ]
    written = write(
        conn,
        app,
        [moves_for(app, machine, label, plan, now) for label, machine, plan in plans if plan.moves],
        now=now,
    )
    current = {label.key: label for label in batch} | {label.key: label for label in written}
    return Settled(
        unmoved=[
            after_evaluation_of(app, machine, label, now)
            for label, machine, plan in plans
            if not plan.moves and not plan.feed_missing
        ],
        waiting=[current[label.key] for label, _, plan in plans if plan.feed_missing is not None],
        labels=current,
    )


def write(
    conn: sa.Connection, app: App, moves: Sequence[Moves], *, now: datetime.datetime
) -> list[Label]:
    """The one writer of moves: store them, then tell the logging plugins."""
    written = transitions.write_moves(conn, moves, now=now)
    note_finished(conn, app.config, moves)  # children that finished: word for their parents
    for move in moves:
        old = move.label.state
        for state in move.states:
            log_transition(
                app, move.label.state_machine, move.label.name, old, state, forced=move.forced
            )
            old = state
    return written


def moves_for(
    app: App, machine: StateMachine, label: Label, plan: Plan, now: datetime.datetime
) -> Moves:
    """``label``'s moves by ``plan``, with when the worker next looks at it where it stops."""
    if plan.feed_missing is not None or plan.ends_in_action:
        return Moves(label, plan.states, due_at(app, plan, now))
    due, next_check_at = arrival(
        app,
        machine,
        label.name,
        label.metadata,
        state=plan.states[-1],
        previous_state=plan.states[-2] if len(plan.states) > 1 else label.state,
        now=now,
    )
    return Moves(label, plan.states, due, next_check_at=next_check_at)


def due_at(app: App, plan: Plan, now: datetime.datetime) -> datetime.datetime | None:
    """When the worker should next look at a label that followed ``plan``.

    An action is due at once; a plan stopped for feeds is due after the
    retry delay, in case nobody fetches them; otherwise nothing is due.
    """
    if plan.ends_in_action:
        return now
    if plan.feed_missing is not None:
        return now + app.settings.evaluation_retry_delay
    return None


def log_transition(
    app: App, state_machine: str, name: str, old: str | None, new: str | None, *, forced: bool
) -> None:
    app.hooks.transition(
        state_machine=state_machine, label=name, old_state=old, new_state=new, forced=forced
    )


def _state_of(machine: StateMachine, label: Label) -> State | None:
    try:
        return machine.get_state(label.state)
    except KeyError:
        return None


def _plan(
    app: App, machine: StateMachine, label: Label, now: datetime.datetime, read_feed: FeedReader
) -> Plan:
    """The label's moves under ``machine``: the definition that governs it (``machine_for``)."""
    return plan_moves(
        machine,
        plan_input_of(label),
        now=now,
        evaluate=True,
        limit=app.settings.max_transitions,
        read_feed=read_feed,
    )


def finish_in_request(app: App, machine: StateMachine, label: Label, plan: Plan) -> Label:
    """After a request's own transaction: fetch the feeds its evaluation needs, briefly."""
    if plan.feed_missing is None:
        return label
    advanced = advance_with_feeds(
        app, label.key, label.entry_id, timeout=app.settings.feed_timeout_in_request
    )
    return advanced or get_label(app, machine, label.name)
