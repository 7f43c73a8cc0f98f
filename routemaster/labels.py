"""The label core: create, update, delete and move labels, in PostgreSQL.

Used by both the API and the worker. Every function here runs its own short
transactions and never holds one while waiting on a remote server: when a
gate's condition reads a feed, the transaction is committed, the feed fetched,
and a new transaction checks the label is still where it was (``entry_id``)
before going on.

A label's current state is on its row; every move also appends a history row
in the same transaction, and that row's id becomes the label's ``entry_id``
(the idempotency token of an action entry).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import (
    Action,
    EntryTrigger,
    Gate,
    MetadataTrigger,
    State,
    StateMachine,
)
from routemaster.exit_conditions.context import Context, FeedUnavailable
from routemaster.http.feeds import fetch_feed
from routemaster.machine.transitions import choose_next_state

DUE_CHANNEL = "routemaster_due"

LABEL_COLUMNS = (
    "state_machine, name, metadata, state, state_entered_at, entry_id, previous_state, "
    "deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at"
)


class LabelExists(Exception):
    """The name is taken in this machine (also by a deleted label)."""


class LabelNotFound(Exception):
    pass


class LabelDeleted(Exception):
    pass


@dataclass(frozen=True)
class Label:
    state_machine: str
    name: str
    metadata: dict[str, Any]
    state: str
    state_entered_at: datetime.datetime
    entry_id: int
    previous_state: str | None
    deleted: bool
    paused: bool
    errored: bool
    last_error: str | None
    attempts: int
    due_at: datetime.datetime | None
    created_at: datetime.datetime
    updated_at: datetime.datetime


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    old_state: str | None
    new_state: str | None
    created: datetime.datetime
    forced: bool
    reason: str | None


class FeedsNeeded(Exception):
    """Raised inside a transaction when an evaluation reads feeds not yet fetched."""

    def __init__(self, names: frozenset[str], label: Label) -> None:
        super().__init__(", ".join(sorted(names)))
        self.names = names
        self.label = label  # where the label is now: moves before this point stand


def _label_from_row(row: sa.Row[Any]) -> Label:
    return Label(**row._mapping)


# ---------------------------------------------------------------- public API


def create_label(app: App, machine: StateMachine, name: str, metadata: dict[str, Any]) -> Label:
    """Create ``name`` in the machine's first state; ``LabelExists`` if the name is taken."""
    now = app.now()
    initial = machine.initial_state
    with app.db.begin() as conn:
        row = conn.execute(
            _CREATE,
            {
                "sm": machine.name,
                "name": name,
                "metadata": json.dumps(metadata),
                "state": initial.name,
                "now": now,
                "due_at": now if isinstance(initial, Action) else None,
            },
        ).first()
        if row is None:
            raise LabelExists(name)
        label = _label_from_row(row)
        if isinstance(initial, Action):
            _notify_due(conn)
            return label
        if not (_has_entry_trigger(initial) or _metadata_triggered(initial, metadata)):
            return label
        try:
            return _advance_locked(conn, app, machine, label, evaluate=True, feeds={})
        except FeedsNeeded as needed:
            label = needed.label
    return _continue_with_feeds(app, machine, label)


def _continue_with_feeds(app: App, machine: StateMachine, label: Label) -> Label:
    """The request's own processing once it needs feeds: fetch them briefly, then go on."""
    return _process(
        app,
        machine,
        label.name,
        expected_entry_id=label.entry_id,
        feed_timeout=app.settings.feed_timeout_in_request,
    ) or get_label(app, machine, label.name)


def get_label(app: App, machine: StateMachine, name: str) -> Label:
    with app.db.connect() as conn:
        row = conn.execute(_SELECT, {"sm": machine.name, "name": name}).first()
    if row is None:
        raise LabelNotFound(name)
    return _label_from_row(row)


def update_metadata(app: App, machine: StateMachine, name: str, patch: dict[str, Any]) -> Label:
    """Deep-merge ``patch`` into the metadata and evaluate the gate if a trigger path was touched.

    The metadata write commits even if the evaluation then fails (a feed is
    down): the label is marked due so the worker retries the evaluation.
    """
    with app.db.begin() as conn:
        row = conn.execute(
            _MERGE_METADATA, {"sm": machine.name, "name": name, "patch": json.dumps(patch)}
        ).first()
        if row is None:
            deleted = conn.execute(_IS_DELETED, {"sm": machine.name, "name": name}).scalar()
            raise LabelNotFound(name) if deleted is None else LabelDeleted(name)
        label = _label_from_row(row)
        state = _state_or_none(machine, label.state)
        if label.paused or not isinstance(state, Gate) or not _metadata_triggered(state, patch):
            return label
        try:
            return _advance_locked(conn, app, machine, label, evaluate=True, feeds={})
        except FeedsNeeded as needed:
            label = needed.label
    return _continue_with_feeds(app, machine, label)


def delete_label(app: App, machine: StateMachine, name: str) -> None:
    """Soft-delete: clear metadata, record it in history, keep the name taken."""
    now = app.now()
    with app.db.begin() as conn:
        deleted = conn.execute(_DELETE, {"sm": machine.name, "name": name, "now": now}).first()
    if deleted is not None:
        _log_transition(app, machine.name, name, deleted.old_state, None, forced=False)


def evaluate_label(
    app: App,
    machine: StateMachine,
    name: str,
    *,
    expected_entry_id: int | None = None,
    feed_timeout: float | None = None,
) -> Label | None:
    """Evaluate the label's current gate now and move it as far as it goes.

    ``None`` when the label is deleted, paused, errored, gone, or no longer
    in the entry ``expected_entry_id``.
    """
    timeout = app.settings.feed_timeout if feed_timeout is None else feed_timeout
    return _process(
        app,
        machine,
        name,
        expected_entry_id=expected_entry_id,
        feed_timeout=timeout,
        clear_due=True,
        required_kind=Gate,
    )


def complete_action(app: App, machine: StateMachine, name: str, entry_id: int) -> Label | None:
    """The action's webhook succeeded: leave the action and continue through what follows."""
    return _process(
        app,
        machine,
        name,
        expected_entry_id=entry_id,
        feed_timeout=app.settings.feed_timeout,
        clear_due=True,
        required_kind=Action,
    )


class InvalidOperation(Exception):
    """An operator command that does not apply to the label as it is (say why)."""


def retry_label(app: App, machine: StateMachine, name: str, *, reason: str | None = None) -> Label:
    """Operator: make an errored label due again, with a fresh attempt count.

    The retry is recorded in history as a forced entry that keeps the state,
    so an audit shows who unblocked what and when. The idempotency token stays
    the same: it is still the same entry into the action.
    """
    with app.db.begin() as conn:
        label = _locked_live_label(conn, machine, name)
        if not label.errored:
            raise InvalidOperation(f"label {name!r} is not errored")
        conn.execute(
            _RECORD_FORCED,
            {
                "sm": machine.name,
                "name": name,
                "state": label.state,
                "now": app.now(),
                "reason": reason or "retried",
            },
        )
        row = conn.execute(_RETRY, {"sm": machine.name, "name": name, "now": app.now()}).one()
        _notify_due(conn)
        return _label_from_row(row)


def set_paused(
    app: App, machine: StateMachine, name: str, paused: bool, *, reason: str | None = None
) -> Label:
    """Operator: a paused label is never evaluated or delivered until resumed."""
    with app.db.begin() as conn:
        label = _locked_live_label(conn, machine, name)
        if label.paused == paused:
            return label
        conn.execute(
            _RECORD_FORCED,
            {
                "sm": machine.name,
                "name": name,
                "state": label.state,
                "now": app.now(),
                "reason": reason or ("paused" if paused else "resumed"),
            },
        )
        row = conn.execute(_SET_PAUSED, {"sm": machine.name, "name": name, "paused": paused}).one()
        if not paused and row.due_at is not None:
            _notify_due(conn)
        return _label_from_row(row)


def force_move(
    app: App, machine: StateMachine, name: str, destination: str, *, reason: str | None = None
) -> Label:
    """Operator: move a label to ``destination`` regardless of conditions, marked as forced."""
    if _state_or_none(machine, destination) is None:
        raise InvalidOperation(f"state machine {machine.name!r} has no state {destination!r}")
    with app.db.begin() as conn:
        label = _locked_live_label(conn, machine, name)
        plan = _Plan(
            label, (destination,), frozenset(), forced=True, reason=reason or "moved by operator"
        )
        return _write_moves(conn, app, [plan])[0]


def _locked_live_label(conn: sa.Connection, machine: StateMachine, name: str) -> Label:
    row = conn.execute(_SELECT_FOR_UPDATE, {"sm": machine.name, "name": name}).first()
    if row is None:
        raise LabelNotFound(name)
    label = _label_from_row(row)
    if label.deleted:
        raise LabelDeleted(name)
    return label


def complete_actions(app: App, delivered: Sequence[tuple[str, str, int]]) -> None:
    """Many successful deliveries, (machine, label, entry_id) each, moved on in one transaction.

    Labels no longer in the delivered entry (an operator moved them) are left
    alone. Those whose next step needs a feed go the one-at-a-time way, with
    the feed fetched outside any transaction.
    """
    if not delivered:
        return
    with app.db.begin() as conn:
        rows = conn.execute(
            _LOCK_ENTRIES,
            {
                "sms": [sm for sm, _, _ in delivered],
                "names": [name for _, name, _ in delivered],
                "entries": [entry_id for _, _, entry_id in delivered],
            },
        ).all()
        batch = [
            label
            for label in map(_label_from_row, rows)
            if isinstance(
                _state_or_none(app.config.get_machine(label.state_machine), label.state), Action
            )
        ]
        outcome = advance_batch_locked(conn, app, batch)
        for sm, name in outcome.unmoved:  # an action with nowhere to go: delivered, done
            conn.execute(_CLEAR_DUE, {"sm": sm, "name": name})
    for sm, name in outcome.need_feeds:
        # It may have moved on already (into a gate that reads a feed): go on from there.
        _process(
            app,
            app.config.get_machine(sm),
            name,
            expected_entry_id=outcome.entries[sm, name],
            feed_timeout=app.settings.feed_timeout,
            clear_due=True,
        )


def history(app: App, machine: StateMachine, name: str) -> list[HistoryEntry]:
    with app.db.connect() as conn:
        rows = conn.execute(_HISTORY, {"sm": machine.name, "name": name}).all()
    return [HistoryEntry(**row._mapping) for row in rows]


def label_context(app: App, machine: StateMachine, label: Label, feed_timeout: float) -> Context:
    """The evaluation context for ``label`` now, fetching feeds lazily over HTTP."""

    def fetch(feed_name: str) -> Any:
        return _fetch_feed(app, machine, feed_name, label.name, feed_timeout)

    return _context(label, app.now(), fetch)


# ---------------------------------------------------------------- internals


def _process(
    app: App,
    machine: StateMachine,
    name: str,
    *,
    expected_entry_id: int | None,
    feed_timeout: float,
    clear_due: bool = False,
    required_kind: type[Gate] | type[Action] | None = None,
) -> Label | None:
    """Lock, advance, and when feeds are needed: commit, fetch, and go round again."""
    feeds: dict[str, Any] = {}
    feeds_entry: int | None = None
    for _ in range(app.settings.max_transitions):
        with app.db.begin() as conn:
            row = conn.execute(_SELECT_FOR_UPDATE, {"sm": machine.name, "name": name}).first()
            if row is None:
                return None
            label = _label_from_row(row)
            if label.deleted or label.paused or label.errored:
                return None
            if expected_entry_id is not None and label.entry_id != expected_entry_id:
                return None
            state = _state_or_none(machine, label.state)
            if required_kind is not None and not isinstance(state, required_kind):
                return None
            required_kind = None  # later rounds continue wherever the label has got to
            if feeds_entry != label.entry_id:
                feeds = {}
            try:
                return _advance_locked(
                    conn, app, machine, label, evaluate=True, feeds=feeds, clear_due=clear_due
                )
            except FeedsNeeded as needed:
                missing = needed.names
                label = needed.label
        # Outside any transaction: fetch what the evaluation asked for.
        try:
            for feed_name in sorted(missing):
                feeds[feed_name] = _fetch_feed(app, machine, feed_name, name, feed_timeout)
        except FeedUnavailable as error:
            _mark_evaluation_failed(app, machine, name, label.entry_id, str(error))
            return get_label(app, machine, name)
        feeds_entry = label.entry_id
        expected_entry_id = label.entry_id
    return get_label(app, machine, name)


def _advance_locked(
    conn: sa.Connection,
    app: App,
    machine: StateMachine,
    label: Label,
    *,
    evaluate: bool,
    feeds: Mapping[str, Any],
    clear_due: bool = False,
) -> Label:
    plan = _plan(app, machine, label, evaluate=evaluate, feeds=feeds)
    if plan.destinations:
        label = _write_moves(conn, app, [plan])[0]
    elif clear_due and (label.due_at is not None or label.attempts):
        row = conn.execute(_CLEAR_DUE, {"sm": label.state_machine, "name": label.name}).one()
        label = _label_from_row(row)
    if plan.feeds_needed:
        raise FeedsNeeded(plan.feeds_needed, label)
    return label


@dataclass(frozen=True)
class BatchOutcome:
    """What :func:`advance_batch_locked` did to each label, by (machine, name)."""

    moved: list[tuple[str, str]]
    unmoved: list[tuple[str, str]]
    need_feeds: list[tuple[str, str]]  # to evaluate again with feeds fetched outside
    entries: dict[tuple[str, str], int]  # each label's entry_id once the batch is written


def advance_batch_locked(conn: sa.Connection, app: App, batch: Sequence[Label]) -> BatchOutcome:
    """Evaluate many locked gate labels and write all their moves in one statement.

    The worker's fast path for triggered gates: the decisions are pure Python
    and the writes one round trip, however many labels move. Labels whose
    evaluation reads a feed are left for the caller (``need_feeds``), after
    any moves they could make without one.
    """
    plans = [
        _plan(app, app.config.get_machine(label.state_machine), label, evaluate=True, feeds={})
        for label in batch
    ]
    written = _write_moves(conn, app, [plan for plan in plans if plan.destinations])
    outcome = BatchOutcome(
        moved=[],
        unmoved=[],
        need_feeds=[],
        entries={(label.state_machine, label.name): label.entry_id for label in batch},
    )
    outcome.entries.update({(label.state_machine, label.name): label.entry_id for label in written})
    for plan in plans:
        key = (plan.label.state_machine, plan.label.name)
        if plan.feeds_needed:
            outcome.need_feeds.append(key)
        elif plan.destinations:
            outcome.moved.append(key)
        else:
            outcome.unmoved.append(key)
    return outcome


@dataclass(frozen=True)
class _Plan:
    label: Label  # as it was when locked
    destinations: tuple[str, ...]  # the states it moves through, in order
    feeds_needed: frozenset[str]  # non-empty: stopped after the moves, for these feeds
    forced: bool = False  # an operator's move, not a decision of the machine
    reason: str | None = None


def _plan(
    app: App,
    machine: StateMachine,
    label: Label,
    *,
    evaluate: bool,
    feeds: Mapping[str, Any],
) -> _Plan:
    """Decide, without I/O, which states the label passes through from here."""
    destinations: list[str] = []
    current = label
    now = app.now()
    for _ in range(app.settings.max_transitions):
        state = _state_or_none(machine, current.state)
        if state is None or not evaluate:
            break
        context = _prefetched_context(current, now, feeds)
        try:
            if isinstance(state, Gate) and not state.exit_condition.evaluate(context):
                break
            destination = choose_next_state(state.next_states, context)
        except FeedUnavailable as missing:
            wanted = frozenset({missing.feed})
            if isinstance(state, Gate):
                wanted |= state.exit_condition.feeds
            return _Plan(label, tuple(destinations), wanted)
        if destination is None:
            break
        destinations.append(destination)
        current = replace(
            current, state=destination, previous_state=current.state, state_entered_at=now
        )
        new_state = machine.get_state(destination)
        if isinstance(new_state, Action):
            break
        evaluate = _has_entry_trigger(new_state)
        feeds = {}
    return _Plan(label, tuple(destinations), frozenset())


def _write_moves(conn: sa.Connection, app: App, plans: Sequence[_Plan]) -> list[Label]:
    """Append every planned move to history and put each label in its last state."""
    if not plans:
        return []
    moves: dict[str, list[Any]] = {
        "sm": [],
        "name": [],
        "old": [],
        "new": [],
        "forced": [],
        "reason": [],
    }
    finals: dict[str, list[Any]] = {"sm": [], "name": [], "due": []}
    for plan in plans:
        machine = app.config.get_machine(plan.label.state_machine)
        old = plan.label.state
        for destination in plan.destinations:
            moves["sm"].append(plan.label.state_machine)
            moves["name"].append(plan.label.name)
            moves["old"].append(old)
            moves["new"].append(destination)
            moves["forced"].append(plan.forced)
            moves["reason"].append(plan.reason)
            old = destination
        finals["sm"].append(plan.label.state_machine)
        finals["name"].append(plan.label.name)
        finals["due"].append(isinstance(machine.get_state(old), Action))
    rows = conn.execute(
        _MOVE_MANY,
        {
            "now": app.now(),
            **{f"m_{key}": value for key, value in moves.items()},
            **{f"f_{key}": value for key, value in finals.items()},
        },
    ).all()
    if any(finals["due"]):
        _notify_due(conn)
    for sm, name, old, new, forced in zip(
        moves["sm"], moves["name"], moves["old"], moves["new"], moves["forced"], strict=True
    ):
        _log_transition(app, sm, name, old, new, forced=forced)
    by_key = {(row.state_machine, row.name): _label_from_row(row) for row in rows}
    return [by_key[plan.label.state_machine, plan.label.name] for plan in plans]


def _mark_evaluation_failed(
    app: App, machine: StateMachine, name: str, entry_id: int, error: str
) -> None:
    with app.db.begin() as conn:
        conn.execute(
            _EVALUATION_FAILED,
            {
                "sm": machine.name,
                "name": name,
                "entry_id": entry_id,
                "error": error,
                "due_at": app.now() + app.settings.evaluation_retry_delay,
            },
        )


def _prefetched_context(label: Label, now: datetime.datetime, feeds: Mapping[str, Any]) -> Context:
    """A context that may read only ``feeds`` (fetched before the transaction)."""

    def fetch(feed_name: str) -> Any:
        if feed_name in feeds:
            return feeds[feed_name]
        raise FeedUnavailable(feed_name, "not fetched yet")

    return _context(label, now, fetch)


def _context(label: Label, now: datetime.datetime, fetch: Callable[[str], Any]) -> Context:
    return Context(
        label=label.name,
        metadata=label.metadata,
        now=now,
        entered_state=label.state_entered_at,
        previous_state=label.previous_state,
        current_state=label.state,
        fetch_feed=fetch,
    )


def _state_or_none(machine: StateMachine, name: str) -> State | None:
    try:
        return machine.get_state(name)
    except KeyError:
        return None


def _has_entry_trigger(state: State) -> bool:
    return isinstance(state, Gate) and any(isinstance(t, EntryTrigger) for t in state.triggers)


def _metadata_triggered(state: State, patch: Mapping[str, Any]) -> bool:
    """Whether an update of ``patch`` touches a metadata-trigger path of the gate."""
    if not isinstance(state, Gate):
        return False
    trigger_paths = [t.path for t in state.triggers if isinstance(t, MetadataTrigger)]
    if not trigger_paths:
        return False
    for touched in _leaf_paths(patch):
        for path in trigger_paths:
            shorter = min(len(path), len(touched))
            if path[:shorter] == touched[:shorter]:
                return True
    return False


def _leaf_paths(
    value: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            yield from _leaf_paths(item, (*prefix, key))
        else:
            yield (*prefix, key)


def _fetch_feed(app: App, machine: StateMachine, feed_name: str, label: str, timeout: float) -> Any:
    def observe(url: str, status: int | None, duration: float) -> None:
        for plugin in app.loggers:
            plugin.feed_fetched(
                state_machine=machine.name,
                label=label,
                feed=feed_name,
                url=url,
                status=status,
                duration=duration,
            )

    return fetch_feed(
        app.http,
        machine,
        feed_name,
        label,
        timeout=timeout,
        observe=observe,
        max_response_bytes=app.settings.max_response_body,
        max_depth=app.settings.max_json_depth,
    )


def _log_transition(
    app: App, state_machine: str, name: str, old: str | None, new: str | None, *, forced: bool
) -> None:
    for plugin in app.loggers:
        plugin.transition(
            state_machine=state_machine, label=name, old_state=old, new_state=new, forced=forced
        )


def _notify_due(conn: sa.Connection) -> None:
    conn.execute(sa.text(f"NOTIFY {DUE_CHANNEL}"))


# ---------------------------------------------------------------- SQL

_CREATE = sa.text(
    f"""
    WITH created AS (
        INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                            due_at, created_at, updated_at)
        VALUES (:sm, :name, CAST(:metadata AS jsonb), :state, :now,
                nextval(pg_get_serial_sequence('history', 'id')), :due_at, :now, :now)
        ON CONFLICT DO NOTHING
        RETURNING {LABEL_COLUMNS}
    ), entry AS (
        INSERT INTO history (id, state_machine, label, old_state, new_state, created)
        SELECT entry_id, state_machine, name, NULL, state, state_entered_at FROM created
    )
    SELECT {LABEL_COLUMNS} FROM created
    """
)

_SELECT = sa.text(f"SELECT {LABEL_COLUMNS} FROM labels WHERE state_machine = :sm AND name = :name")

_SELECT_FOR_UPDATE = sa.text(
    f"SELECT {LABEL_COLUMNS} FROM labels WHERE state_machine = :sm AND name = :name FOR UPDATE"
)

_LOCK_ENTRIES = sa.text(
    f"""
    SELECT {", ".join("labels." + column for column in LABEL_COLUMNS.split(", "))}
    FROM labels JOIN unnest(CAST(:sms AS text[]), CAST(:names AS text[]),
                            CAST(:entries AS bigint[])) AS wanted(sm, name, entry_id)
      ON labels.state_machine = wanted.sm AND labels.name = wanted.name
         AND labels.entry_id = wanted.entry_id
    WHERE NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
    ORDER BY labels.state_machine, labels.name
    FOR UPDATE OF labels
    """
)

# The row lock the UPDATE takes serialises concurrent merges: none is lost.
_MERGE_METADATA = sa.text(
    f"""
    UPDATE labels SET metadata = routemaster_deep_merge(metadata, CAST(:patch AS jsonb)),
                      updated_at = now()
    WHERE state_machine = :sm AND name = :name AND NOT deleted
    RETURNING {LABEL_COLUMNS}
    """
)

_IS_DELETED = sa.text("SELECT deleted FROM labels WHERE state_machine = :sm AND name = :name")

# History ids follow the ORDER BY of the INSERT's SELECT, so each label's
# highest new id is its last move: that row becomes its entry.
_MOVE_MANY = sa.text(
    f"""
    WITH moves AS (
        SELECT m.*, ordinality AS seq
        FROM unnest(CAST(:m_sm AS text[]), CAST(:m_name AS text[]),
                    CAST(:m_old AS text[]), CAST(:m_new AS text[]),
                    CAST(:m_forced AS boolean[]), CAST(:m_reason AS text[]))
             WITH ORDINALITY AS m(state_machine, name, old_state, new_state, forced, reason)
    ), entries AS (
        INSERT INTO history (state_machine, label, old_state, new_state, created, forced, reason)
        SELECT state_machine, name, old_state, new_state, :now, forced, reason
        FROM moves ORDER BY seq
        RETURNING id, state_machine, label, old_state, new_state
    ), latest AS (
        SELECT DISTINCT ON (state_machine, label) id, state_machine, label, old_state, new_state
        FROM entries ORDER BY state_machine, label, id DESC
    ), finals AS (
        SELECT * FROM unnest(CAST(:f_sm AS text[]), CAST(:f_name AS text[]),
                             CAST(:f_due AS boolean[])) AS f(state_machine, name, due)
    )
    UPDATE labels SET
        state = latest.new_state, previous_state = latest.old_state,
        state_entered_at = :now, entry_id = latest.id, updated_at = now(),
        due_at = CASE WHEN finals.due THEN CAST(:now AS timestamptz) END,
        attempts = 0, errored = false, last_error = NULL, lease_owner = NULL
    FROM latest JOIN finals
        ON finals.state_machine = latest.state_machine AND finals.name = latest.label
    WHERE labels.state_machine = latest.state_machine AND labels.name = latest.label
    RETURNING {", ".join("labels." + column for column in LABEL_COLUMNS.split(", "))}
    """
)

_CLEAR_DUE = sa.text(
    f"""
    UPDATE labels SET due_at = NULL, attempts = 0, last_error = NULL, lease_owner = NULL
    WHERE state_machine = :sm AND name = :name
    RETURNING {LABEL_COLUMNS}
    """
)

_EVALUATION_FAILED = sa.text(
    """
    UPDATE labels SET due_at = :due_at, last_error = :error, lease_owner = NULL
    WHERE state_machine = :sm AND name = :name AND entry_id = :entry_id AND NOT deleted
    """
)

_DELETE = sa.text(
    """
    WITH deleted AS (
        UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                          lease_owner = NULL, updated_at = now()
        WHERE state_machine = :sm AND name = :name AND NOT deleted
        RETURNING state_machine, name, state
    )
    INSERT INTO history (state_machine, label, old_state, new_state, created, reason)
    SELECT state_machine, name, state, NULL, :now, 'deleted' FROM deleted
    RETURNING old_state
    """
)

_RECORD_FORCED = sa.text(
    """
    INSERT INTO history (state_machine, label, old_state, new_state, created, forced, reason)
    VALUES (:sm, :name, :state, :state, :now, true, :reason)
    """
)

_RETRY = sa.text(
    f"""
    UPDATE labels SET errored = false, attempts = 0, due_at = :now, lease_owner = NULL,
                      updated_at = now()
    WHERE state_machine = :sm AND name = :name
    RETURNING {LABEL_COLUMNS}
    """
)

_SET_PAUSED = sa.text(
    f"""
    UPDATE labels SET paused = :paused, lease_owner = NULL, updated_at = now()
    WHERE state_machine = :sm AND name = :name
    RETURNING {LABEL_COLUMNS}
    """
)

_HISTORY = sa.text(
    """
    SELECT id, old_state, new_state, created, forced, reason FROM history
    WHERE state_machine = :sm AND label = :name ORDER BY id
    """
)
