"""Label rows and their history: every statement that reads or writes them.

A label's current state is on its row; every move also appends a history row
in the same statement, and that row's id becomes the label's ``entry_id`` (the
idempotency token of an action entry, and the "is it still where it was"
check after remote calls).

Every statement naming one label names its ``shard_key`` too
(:func:`routemaster.db.keys.shard_key`), so on Citus it runs on that label's
shard alone, and passes the time as a parameter (Citus refuses ``now()`` in
a ``CASE`` and in the UPDATE of a distributed table). History rows name their
shard key, version and transaction as :mod:`routemaster.db.history` says.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db import history as history_rows
from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.notifications import notify_due
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import Prepared, Row, fetch_all, fetch_one, run, single_statement

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
    "version",
)
"""A label row's columns, in the order every statement that returns labels lists them."""


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
    # the machine version the label follows (``continue``) or was created under (``abort``);
    # None for an ``upgrade`` machine's label: it follows the definition in force
    version: int | None

    @property
    def key(self) -> LabelKey:
        return (self.state_machine, self.name)

    @property
    def live(self) -> bool:
        return not (self.deleted or self.paused or self.errored)


def history_kind(
    recorded_kind: str | None, forced: bool, old_state: str | None, new_state: str | None
) -> str:
    """What a history row records: created, moved, deleted, forced or errored."""
    if recorded_kind is not None:
        return recorded_kind
    if forced:
        return "forced"
    if old_state is None:
        return "created"
    if new_state is None:
        return "deleted"
    return "moved"


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    old_state: str | None
    new_state: str | None
    created: datetime.datetime
    forced: bool
    reason: str | None
    recorded_kind: str | None = None  # "errored"; None: what the states and forced say

    @property
    def kind(self) -> str:
        return history_kind(self.recorded_kind, self.forced, self.old_state, self.new_state)

    version: int | None = None  # the machine version the writing process ran


@dataclass(frozen=True)
class Moves:
    """One label's moves to write: through ``states`` in order, from where it was locked."""

    label: Label
    states: tuple[str, ...]
    due_at: datetime.datetime | None  # when the worker next looks at it (an action: now)
    forced: bool = False
    reason: str | None = None
    next_check_at: datetime.datetime | None = None  # in a gate evaluated at moments (SPEC E1)


def label_from_row(row: Row) -> Label:
    """A label from a row holding the columns in :data:`LABEL_COLUMNS` order."""
    return Label(*row)


def _one(state_machine: str, name: str) -> dict[str, Any]:
    """One label's parameters: machine, name, index and shard keys (``routemaster/db/keys.py``)."""
    return {
        "sm": state_machine,
        "name": name,
        "key": label_key(name),
        "shard_key": shard_key(name),
    }


def insert(
    conn: sa.Connection,
    state_machine: str,
    name: str,
    metadata: dict[str, Any],
    *,
    state: str,
    now: datetime.datetime,
    due: bool = False,
    due_at: datetime.datetime | None = None,
    next_check_at: datetime.datetime | None = None,
    version: int | None = None,
) -> Label | None:
    """A new label and its first history entry; ``None`` when the name is taken.

    When the worker first looks at it: ``due_at`` (a gate evaluated at
    moments: its schedule), else now if ``due`` (an action); ``next_check_at``:
    a gate's next check (SPEC E1). ``version``: the machine version it is created
    under, kept only for machines whose labels keep it (``upgrade_strategy: continue``
    or ``abort``).
    """
    if due_at is None and due:
        due_at = now
    params = {
        **_one(state_machine, name),
        "metadata": json.dumps(metadata),
        "state": state,
        "now": now,
        "due_at": due_at,
        "next_check_at": next_check_at,
        "version": version,
        "history_version": history_rows.version_for(conn, state_machine, version),
    }
    if distributed(conn):
        row = fetch_one(conn, _INSERT_LABEL, params)
        if row is not None:
            run(conn, _INSERT_FIRST_ENTRY, {**params, "entry_id": row[5]})
    else:
        row = fetch_one(conn, _PREPARED_INSERT, params)
    if row is not None and due_at is not None and due_at <= now:
        notify_due(conn)
    return None if row is None else label_from_row(row)


def writing(engine: sa.Engine) -> AbstractContextManager[sa.Connection]:
    """The connection a write of one label with its history row (:func:`insert`,
    :func:`soft_delete`) runs on: one autocommit statement on one server; on Citus a
    transaction, where the label's row and its history row are two router statements (one
    statement feeding the history row from the label's, a modifying CTE, is run by Citus
    through an intermediate result and commits in two phases on both workers)."""
    return engine.begin() if distributed(engine) else single_statement(engine)


def get(conn: sa.Connection, state_machine: str, name: str) -> Label | None:
    row = fetch_one(conn, _PREPARED_SELECT, _one(state_machine, name))
    return None if row is None else label_from_row(row)


def lock(conn: sa.Connection, state_machine: str, name: str) -> Label | None:
    """The label, row-locked until the transaction ends."""
    row = fetch_one(conn, _SELECT_FOR_UPDATE, _one(state_machine, name))
    return None if row is None else label_from_row(row)


def merge_metadata(
    conn: sa.Connection,
    state_machine: str,
    name: str,
    patch: dict[str, Any],
    *,
    now: datetime.datetime,
    scheduled_states: Sequence[str] = (),
) -> Label | None:
    """Deep-merge ``patch`` into a live label's metadata; ``None`` if there is no such label.

    The row lock the UPDATE takes serialises concurrent merges: none is lost.
    A label in one of ``scheduled_states`` (gates evaluated at moments) is left
    for the caller to reschedule in the same transaction (:func:`schedule`).
    """
    params = {
        **_one(state_machine, name),
        "patch": json.dumps(patch),
        "scheduled_states": list(scheduled_states),
        "now": now,
    }
    row = fetch_one(conn, _MERGE_METADATA, params)
    return None if row is None else label_from_row(row)


def is_deleted(conn: sa.Connection, state_machine: str, name: str) -> bool | None:
    """Whether the label was deleted; ``None`` when it never existed."""
    row = fetch_one(conn, _IS_DELETED, _one(state_machine, name))
    return None if row is None else bool(row[0])


def clear_due(conn: sa.Connection, keys: Iterable[LabelKey]) -> None:
    """Nothing more to do for these labels (an action with no ``next``) until someone acts."""
    params = label_key_arrays(keys)
    if params["names"]:
        run(conn, _CLEAR_DUE, params)


def mark_due(conn: sa.Connection, key: LabelKey, *, at: datetime.datetime) -> None:
    """An evaluation is owed by ``at`` (or sooner, if it already was)."""
    run(conn, _MARK_DUE, {**_one(*key), "at": at})


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
    run(
        conn,
        _EVALUATION_FAILED,
        {**_one(*key), "entry_id": entry_id, "error": error, "due_at": due_at},
    )


def soft_delete(
    conn: sa.Connection, state_machine: str, name: str, *, now: datetime.datetime
) -> str | None:
    """Clear the metadata and record the deletion; the state it left, or ``None`` if nothing.

    On Citus two router statements in the caller's transaction (:func:`writing`): the
    label's row, locked and marked, then its history row.
    """
    if distributed(conn):
        marked = fetch_one(conn, _MARK_DELETED, {**_one(state_machine, name), "now": now})
        if marked is None:
            return None
        _, _, state, version = marked
        entry = history_rows.Entry(state_machine, name, state, None, False, "deleted", version)
        history_rows.append_one(conn, entry, now=now)
        return str(state)
    row = fetch_one(
        conn,
        _DELETE,
        {
            **_one(state_machine, name),
            **history_rows.version_params(conn, state_machine),
            "now": now,
        },
    )
    return None if row is None else str(row[0])


def record_forced(
    conn: sa.Connection, label: Label, *, now: datetime.datetime, reason: str
) -> None:
    """An operator command that keeps the state, recorded for the audit trail."""
    entry = history_rows.Entry(
        label.state_machine, label.name, label.state, label.state, True, reason, label.version
    )
    history_rows.append_one(conn, entry, now=now)


def retry(conn: sa.Connection, label: Label, *, now: datetime.datetime, reason: str) -> Label:
    """The locked, errored ``label`` due again now with a fresh attempt count, recorded as
    forced with ``reason``: every retry (an operator's, a bulk command's, those of a
    receiver's errored labels) is this one."""
    record_forced(conn, label, now=now, reason=reason)
    row = fetch_one(conn, _RETRY, {**_one(*label.key), "now": now})
    assert row is not None, "the label is locked by the caller"
    notify_due(conn)
    return label_from_row(row)


def set_paused(conn: sa.Connection, label: Label, paused: bool, *, now: datetime.datetime) -> Label:
    row = fetch_one(conn, _SET_PAUSED, {**_one(*label.key), "paused": paused, "now": now})
    assert row is not None, "the label is locked by the caller"
    updated = label_from_row(row)
    if not paused and updated.due_at is not None:
        notify_due(conn)
    return updated


def history(conn: sa.Connection, state_machine: str, name: str) -> list[HistoryEntry]:
    rows = fetch_all(
        conn, _HISTORY, {"sm": state_machine, "name": name, "shard_key": shard_key(name)}
    )
    return [HistoryEntry(*row) for row in rows]


# One label is found through the primary key (``name_key``, ``shard_key``) and checked by its
# full name.

_INSERT = """
    WITH created AS (
        INSERT INTO labels (shard_key, state_machine, name, name_key, metadata, state,
                            state_entered_at, entry_id, due_at, next_check_at, created_at,
                            updated_at, scheduled_at, version)
        VALUES (%(shard_key)s, %(sm)s, %(name)s, %(key)s, CAST(%(metadata)s AS jsonb), %(state)s,
                %(now)s, nextval(pg_get_serial_sequence('history', 'id')), %(due_at)s,
                %(next_check_at)s, %(now)s, %(now)s, %(now)s, %(version)s)
        ON CONFLICT (state_machine, name_key, shard_key) DO NOTHING
        RETURNING state_machine, name, metadata, state, state_entered_at, entry_id,
                  previous_state, deleted, paused, errored, last_error, attempts, due_at,
                  created_at, updated_at, version
    ), entry AS (
        INSERT INTO history (id, shard_key, state_machine, label, old_state, new_state, created,
                             version, xact_id)
        SELECT entry_id, %(shard_key)s, state_machine, name, NULL, state, state_entered_at,
               %(history_version)s, pg_current_xact_id()
        FROM created
    )
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM created
    """

_INSERT_LABEL = """
    INSERT INTO labels (shard_key, state_machine, name, name_key, metadata, state,
                        state_entered_at, entry_id, due_at, next_check_at, created_at,
                        updated_at, scheduled_at, version)
    VALUES (%(shard_key)s, %(sm)s, %(name)s, %(key)s, CAST(%(metadata)s AS jsonb), %(state)s,
            %(now)s, nextval(pg_get_serial_sequence('history', 'id')), %(due_at)s,
            %(next_check_at)s, %(now)s, %(now)s, %(now)s, %(version)s)
    ON CONFLICT (state_machine, name_key, shard_key) DO NOTHING
    RETURNING state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
              deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
              version
    """
"""On Citus, :data:`_INSERT`'s label alone: a router statement (:func:`insert`)."""

_INSERT_FIRST_ENTRY = """
    INSERT INTO history (id, shard_key, state_machine, label, old_state, new_state, created,
                         version, xact_id)
    VALUES (%(entry_id)s, %(shard_key)s, %(sm)s, %(name)s, NULL, %(state)s, %(now)s,
            %(history_version)s, pg_current_xact_id())
    """
"""On Citus, :data:`_INSERT`'s first history entry, in the same transaction (:func:`insert`)."""

_SELECT = """
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """

_SELECT_FOR_UPDATE = """
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    FOR UPDATE
    """

_MERGE_METADATA = """
    UPDATE labels SET metadata = routemaster_deep_merge(metadata, CAST(%(patch)s AS jsonb)),
                      updated_at = %(now)s,
                      scheduled_at = CASE
                          WHEN state = ANY(CAST(%(scheduled_states)s AS text[])) THEN scheduled_at
                          WHEN scheduled_at = updated_at THEN %(now)s
                          ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
    RETURNING state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
              deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
              version
    """

_IS_DELETED = """
    SELECT deleted FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """

_CLEAR_DUE = """
    UPDATE labels SET due_at = NULL, attempts = 0, last_error = NULL, lease_owner = NULL
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]))
         AS done(shard_key, sm, key, name)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = done.shard_key AND labels.state_machine = done.sm
      AND labels.name_key = done.key AND labels.name = done.name
    """

_MARK_DUE = """
    UPDATE labels SET due_at = LEAST(COALESCE(due_at, %(at)s), %(at)s)
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """

_EVALUATION_FAILED = """
    UPDATE labels SET due_at = %(due_at)s, last_error = %(error)s, lease_owner = NULL
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
      AND (CAST(%(entry_id)s AS bigint) IS NULL OR entry_id = %(entry_id)s)
    """

_MARK_DELETED = """
    UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                      lease_owner = NULL, updated_at = %(now)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
    RETURNING state_machine, name, state, version
    """
"""On Citus, :data:`_DELETE`'s label alone: a router statement before its history row
(:func:`soft_delete`)."""

_DELETE = """
    WITH deleted AS (
        UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                          lease_owner = NULL, updated_at = %(now)s
        WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
        RETURNING state_machine, name, state, version
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, reason,
                         version, xact_id)
    SELECT %(shard_key)s, state_machine, name, state, NULL, %(now)s, 'deleted',
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           pg_current_xact_id()
    FROM deleted
    RETURNING old_state
    """

_RETRY = """
    UPDATE labels SET errored = false, attempts = 0, due_at = %(now)s, lease_owner = NULL,
                      updated_at = %(now)s, scheduled_at = CASE WHEN scheduled_at = updated_at
                                                                THEN %(now)s
                                                                ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    RETURNING state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
              deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
              version
    """

_SET_PAUSED = """
    UPDATE labels SET paused = %(paused)s, lease_owner = NULL, updated_at = %(now)s,
                      scheduled_at = CASE WHEN scheduled_at = updated_at
                                          THEN %(now)s ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    RETURNING state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
              deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
              version
    """

_HISTORY = """
    SELECT id, old_state, new_state, created, forced, reason, kind, version FROM history
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND label = %(name)s ORDER BY id
    """

# The API's create and read, prepared once per connection (see routemaster.db.statements).
_PREPARED_INSERT = Prepared("routemaster_label_insert", _INSERT)
_PREPARED_SELECT = Prepared("routemaster_label_select", _SELECT)
