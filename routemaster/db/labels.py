"""Label rows and their history: every statement that reads or writes them.

A label's current state is on its row; every move also appends a history row
in the same statement, and that row's id becomes the label's ``entry_id`` (the
idempotency token of an action entry, and the "is it still where it was"
check after remote calls).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.notifications import notify_due

LabelKey = tuple[str, str]
"""(state machine, label name)."""

LABEL_COLUMNS = (
    "state_machine",
    "name",
    "metadata",
    "state",
    "state_entered_at",
    "entry_id",
    "previous_state",
    "deleted",
    "paused",
    "errored",
    "last_error",
    "attempts",
    "due_at",
    "created_at",
    "updated_at",
)
_COLUMNS = ", ".join(LABEL_COLUMNS)
_LABELS_COLUMNS = ", ".join(f"labels.{column}" for column in LABEL_COLUMNS)

LIVE = "NOT deleted AND NOT paused AND NOT errored"
"""A label the machine may move: the one spelling of it in SQL."""


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

    @property
    def key(self) -> LabelKey:
        return (self.state_machine, self.name)

    @property
    def live(self) -> bool:
        return not (self.deleted or self.paused or self.errored)


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    old_state: str | None
    new_state: str | None
    created: datetime.datetime
    forced: bool
    reason: str | None


@dataclass(frozen=True)
class Moves:
    """One label's moves to write: through ``states`` in order, from where it was locked."""

    label: Label
    states: tuple[str, ...]
    due_at: datetime.datetime | None  # when the worker next looks at it (an action: now)
    forced: bool = False
    reason: str | None = None


def _label(row: sa.Row[Any]) -> Label:
    return Label(**row._mapping)


def _keys(keys: Iterable[LabelKey]) -> dict[str, list[str]]:
    machines: list[str] = []
    names: list[str] = []
    for machine, name in keys:
        machines.append(machine)
        names.append(name)
    return {"machines": machines, "names": names}


def insert(
    conn: sa.Connection,
    state_machine: str,
    name: str,
    metadata: dict[str, Any],
    *,
    state: str,
    now: datetime.datetime,
    due: bool,
) -> Label | None:
    """A new label and its first history entry; ``None`` when the name is taken."""
    row = conn.execute(
        _INSERT,
        {
            "sm": state_machine,
            "name": name,
            "metadata": json.dumps(metadata),
            "state": state,
            "now": now,
            "due_at": now if due else None,
        },
    ).first()
    if row is not None and due:
        notify_due(conn)
    return None if row is None else _label(row)


def get(conn: sa.Connection, state_machine: str, name: str) -> Label | None:
    row = conn.execute(_SELECT, {"sm": state_machine, "name": name}).first()
    return None if row is None else _label(row)


def lock(conn: sa.Connection, state_machine: str, name: str) -> Label | None:
    """The label, row-locked until the transaction ends."""
    row = conn.execute(_SELECT_FOR_UPDATE, {"sm": state_machine, "name": name}).first()
    return None if row is None else _label(row)


def lock_entries(conn: sa.Connection, entries: Sequence[tuple[str, str, int]]) -> list[Label]:
    """Lock the live labels still in the given entries, (machine, name, entry_id) each."""
    if not entries:
        return []
    rows = conn.execute(
        _LOCK_ENTRIES,
        {
            "machines": [machine for machine, _, _ in entries],
            "names": [name for _, name, _ in entries],
            "entries": [entry_id for _, _, entry_id in entries],
        },
    ).all()
    return [_label(row) for row in rows]


def merge_metadata(
    conn: sa.Connection, state_machine: str, name: str, patch: dict[str, Any]
) -> Label | None:
    """Deep-merge ``patch`` into a live label's metadata; ``None`` if there is no such label.

    The row lock the UPDATE takes serialises concurrent merges: none is lost.
    """
    row = conn.execute(
        _MERGE_METADATA, {"sm": state_machine, "name": name, "patch": json.dumps(patch)}
    ).first()
    return None if row is None else _label(row)


def is_deleted(conn: sa.Connection, state_machine: str, name: str) -> bool | None:
    """Whether the label was deleted; ``None`` when it never existed."""
    result: bool | None = conn.execute(_IS_DELETED, {"sm": state_machine, "name": name}).scalar()
    return result


def write_moves(
    conn: sa.Connection, moves: Sequence[Moves], *, now: datetime.datetime
) -> list[Label]:
    """Append every move to history and put each label in its last state, in one statement.

    Returns the labels as written, in the order of ``moves``.
    """
    moves = [move for move in moves if move.states]
    if not moves:
        return []
    history: dict[str, list[Any]] = {
        key: [] for key in ("m_sm", "m_name", "m_old", "m_new", "m_forced", "m_reason")
    }
    finals: dict[str, list[Any]] = {"f_sm": [], "f_name": [], "f_due_at": []}
    for move in moves:
        old = move.label.state
        for state in move.states:
            history["m_sm"].append(move.label.state_machine)
            history["m_name"].append(move.label.name)
            history["m_old"].append(old)
            history["m_new"].append(state)
            history["m_forced"].append(move.forced)
            history["m_reason"].append(move.reason)
            old = state
        finals["f_sm"].append(move.label.state_machine)
        finals["f_name"].append(move.label.name)
        finals["f_due_at"].append(move.due_at)
    rows = conn.execute(_MOVE_MANY, {"now": now, **history, **finals}).all()
    if any(due_at is not None for due_at in finals["f_due_at"]):
        notify_due(conn)
    by_key = {(row.state_machine, row.name): _label(row) for row in rows}
    return [by_key[move.label.key] for move in moves]


def clear_due(conn: sa.Connection, keys: Iterable[LabelKey]) -> None:
    """Nothing more to do for these labels until a trigger or an update makes them due."""
    params = _keys(keys)
    if params["names"]:
        conn.execute(_CLEAR_DUE, params)


def mark_due(conn: sa.Connection, key: LabelKey, *, at: datetime.datetime) -> None:
    """An evaluation is owed by ``at`` (or sooner, if it already was)."""
    conn.execute(_MARK_DUE, {"sm": key[0], "name": key[1], "at": at})


def record_evaluation_failure(
    conn: sa.Connection,
    key: LabelKey,
    *,
    error: str,
    due_at: datetime.datetime,
    entry_id: int | None = None,
) -> None:
    """An evaluation failed (a feed is down): due again at ``due_at``, the error visible.

    With ``entry_id``, only if the label is still in that entry.
    """
    conn.execute(
        _EVALUATION_FAILED,
        {"sm": key[0], "name": key[1], "entry_id": entry_id, "error": error, "due_at": due_at},
    )


def soft_delete(
    conn: sa.Connection, state_machine: str, name: str, *, now: datetime.datetime
) -> str | None:
    """Clear the metadata and record the deletion; the state it left, or ``None`` if nothing."""
    row = conn.execute(_DELETE, {"sm": state_machine, "name": name, "now": now}).first()
    return None if row is None else str(row.old_state)


def record_forced(
    conn: sa.Connection, label: Label, *, now: datetime.datetime, reason: str
) -> None:
    """An operator command that keeps the state, recorded for the audit trail."""
    conn.execute(
        _RECORD_FORCED,
        {
            "sm": label.state_machine,
            "name": label.name,
            "state": label.state,
            "now": now,
            "reason": reason,
        },
    )


def make_retryable(conn: sa.Connection, label: Label, *, now: datetime.datetime) -> Label:
    """An errored label due again now, with a fresh attempt count."""
    row = conn.execute(_RETRY, {"sm": label.state_machine, "name": label.name, "now": now}).one()
    notify_due(conn)
    return _label(row)


def set_paused(conn: sa.Connection, label: Label, paused: bool) -> Label:
    row = conn.execute(
        _SET_PAUSED, {"sm": label.state_machine, "name": label.name, "paused": paused}
    ).one()
    updated = _label(row)
    if not paused and updated.due_at is not None:
        notify_due(conn)
    return updated


def history(conn: sa.Connection, state_machine: str, name: str) -> list[HistoryEntry]:
    rows = conn.execute(_HISTORY, {"sm": state_machine, "name": name}).all()
    return [HistoryEntry(**row._mapping) for row in rows]


_INSERT = sa.text(
    f"""
    WITH created AS (
        INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                            due_at, created_at, updated_at)
        VALUES (:sm, :name, CAST(:metadata AS jsonb), :state, :now,
                nextval(pg_get_serial_sequence('history', 'id')), :due_at, :now, :now)
        ON CONFLICT DO NOTHING
        RETURNING {_COLUMNS}
    ), entry AS (
        INSERT INTO history (id, state_machine, label, old_state, new_state, created)
        SELECT entry_id, state_machine, name, NULL, state, state_entered_at FROM created
    )
    SELECT {_COLUMNS} FROM created
    """
)

_SELECT = sa.text(f"SELECT {_COLUMNS} FROM labels WHERE state_machine = :sm AND name = :name")

_SELECT_FOR_UPDATE = sa.text(
    f"SELECT {_COLUMNS} FROM labels WHERE state_machine = :sm AND name = :name FOR UPDATE"
)

_LOCK_ENTRIES = sa.text(
    f"""
    SELECT {_LABELS_COLUMNS}
    FROM labels JOIN unnest(CAST(:machines AS text[]), CAST(:names AS text[]),
                            CAST(:entries AS bigint[])) AS wanted(sm, name, entry_id)
      ON labels.state_machine = wanted.sm AND labels.name = wanted.name
         AND labels.entry_id = wanted.entry_id
    WHERE {LIVE}
    ORDER BY labels.state_machine, labels.name
    FOR UPDATE OF labels
    """
)

_MERGE_METADATA = sa.text(
    f"""
    UPDATE labels SET metadata = routemaster_deep_merge(metadata, CAST(:patch AS jsonb)),
                      updated_at = now()
    WHERE state_machine = :sm AND name = :name AND NOT deleted
    RETURNING {_COLUMNS}
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
                             CAST(:f_due_at AS timestamptz[])) AS f(state_machine, name, due_at)
    )
    UPDATE labels SET
        state = latest.new_state, previous_state = latest.old_state,
        state_entered_at = :now, entry_id = latest.id, updated_at = now(),
        due_at = finals.due_at,
        attempts = 0, errored = false, last_error = NULL, lease_owner = NULL
    FROM latest JOIN finals
        ON finals.state_machine = latest.state_machine AND finals.name = latest.label
    WHERE labels.state_machine = latest.state_machine AND labels.name = latest.label
    RETURNING {_LABELS_COLUMNS}
    """
)

_CLEAR_DUE = sa.text(
    """
    UPDATE labels SET due_at = NULL, attempts = 0, last_error = NULL, lease_owner = NULL
    FROM unnest(CAST(:machines AS text[]), CAST(:names AS text[])) AS done(sm, name)
    WHERE labels.state_machine = done.sm AND labels.name = done.name
    """
)

_MARK_DUE = sa.text(
    """
    UPDATE labels SET due_at = LEAST(COALESCE(due_at, :at), :at)
    WHERE state_machine = :sm AND name = :name
    """
)

_EVALUATION_FAILED = sa.text(
    """
    UPDATE labels SET due_at = :due_at, last_error = :error, lease_owner = NULL
    WHERE state_machine = :sm AND name = :name AND NOT deleted
      AND (CAST(:entry_id AS bigint) IS NULL OR entry_id = :entry_id)
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
    RETURNING {_COLUMNS}
    """
)

_SET_PAUSED = sa.text(
    f"""
    UPDATE labels SET paused = :paused, lease_owner = NULL, updated_at = now()
    WHERE state_machine = :sm AND name = :name
    RETURNING {_COLUMNS}
    """
)

_HISTORY = sa.text(
    """
    SELECT id, old_state, new_state, created, forced, reason FROM history
    WHERE state_machine = :sm AND label = :name ORDER BY id
    """
)
