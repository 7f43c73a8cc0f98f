"""Label transitions: every change of what a label is, each one function, with its history row.

A label is created, has its metadata merged (by an update, or by a pull
task's completion), moves, becomes errored, is retried, paused and resumed,
deleted (by the API, a bulk command or retention), removed with its history
(retention's purge), and put on another version of its machine (a
configuration's rename, an upgrade) here and nowhere else: each transition is
one function of this module, which every path to it calls (the API, the
worker, operator and bulk commands, receivers' upkeep, retention,
configuration migrations). Writes that only keep a label's due time
(:mod:`routemaster.db.schedules`) or its lease (:mod:`routemaster.db.label_claims`,
``db/tasks.py``) are not transitions and live with the queue they serve;
``tests/db/test_transitions.py`` checks that no statement elsewhere creates,
deletes or changes what a label is, or writes history.

**History is appended here alone.** A transition that creates, moves or
deletes a label writes its history row in the same statement as the label's
row (one round trip, and the kept counts of :mod:`routemaster.db.label_counts`,
folded from history, never miss a change); a history row that goes with no
change of state (an operator's forced entry, an error, a retry, a pause) is
appended by :func:`append` or :func:`append_one`. Every one names the row's
shard key, version and transaction as :mod:`routemaster.db.history` says
(``tests/db/test_history_writers.py`` checks).

**Keyed by the label.** Every statement naming one label names its
``shard_key`` (:func:`routemaster.db.keys.shard_key`), and a batch names its
labels' (``= ANY(...)``), so on Citus it runs on those shards alone, and
passes the time as a parameter (Citus refuses ``now()`` in a ``CASE`` and in
the UPDATE of a distributed table). On Citus a statement that feeds history
from the label's row through a modifying CTE is run through an intermediate
result and commits in two phases on both workers: there a create, a delete
and an error are two router statements instead, the label's row then its
history row, in the caller's transaction (:func:`writing`); each such twin
sits next to the statement it stands for.

Statements are written and run as :mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.claimed import Claim
from routemaster.db.history import Entry, version_for, version_params
from routemaster.db.keys import label_key, label_key_arrays, label_keys, shard_key, shard_keys
from routemaster.db.labels import (
    Label,
    LabelKey,
    Moves,
    label_from_row,
    label_params,
    serialises,
)
from routemaster.db.notifications import notify_due, notify_due_times
from routemaster.db.plumbing.database import distributed
from routemaster.db.shards import shard_map, take
from routemaster.db.statements import Prepared, fetch_all, fetch_one, run, single_statement

FINISHED_REASON = "retention: finished"
"""The reason of a deletion by retention (:func:`delete_finished`)."""


def writing(engine: sa.Engine) -> AbstractContextManager[sa.Connection]:
    """The connection a write of one label with its history row (:func:`insert`,
    :func:`soft_delete`) runs on: one autocommit statement on one server; on Citus a
    transaction, where the label's row and its history row are two router statements (one
    statement feeding the history row from the label's, a modifying CTE, is run by Citus
    through an intermediate result and commits in two phases on both workers)."""
    return engine.begin() if distributed(engine) else single_statement(engine)


# --- history rows that go with no change of state ------------------------------------------


def append(conn: sa.Connection, entries: Sequence[Entry], *, now: datetime.datetime) -> None:
    """Append ``entries`` to history, in one statement."""
    if not entries:
        return
    machines = [entry.state_machine for entry in entries]
    names = [entry.label for entry in entries]
    run(
        conn,
        _APPEND,
        {
            "shard_keys": shard_keys(names),
            "machines": machines,
            "names": names,
            "olds": [entry.old_state for entry in entries],
            "news": [entry.new_state for entry in entries],
            "forceds": [entry.forced for entry in entries],
            "reasons": [entry.reason for entry in entries],
            "kinds": [entry.kind for entry in entries],
            "versions": [
                version_for(conn, entry.state_machine, entry.label_version) for entry in entries
            ],
            "now": now,
        },
    )


def append_one(conn: sa.Connection, entry: Entry, *, now: datetime.datetime) -> None:
    """One row of :func:`append`, through a statement naming one shard key (a router insert)."""
    run(
        conn,
        _APPEND_ONE,
        {
            "shard_key": shard_key(entry.label),
            "sm": entry.state_machine,
            "name": entry.label,
            "old": entry.old_state,
            "new": entry.new_state,
            "forced": entry.forced,
            "reason": entry.reason,
            "kind": entry.kind,
            "version": version_for(conn, entry.state_machine, entry.label_version),
            "now": now,
        },
    )


def record_forced(
    conn: sa.Connection, label: Label, *, now: datetime.datetime, reason: str
) -> None:
    """An operator command that keeps the state, recorded for the audit trail."""
    entry = Entry(
        label.state_machine, label.name, label.state, label.state, True, reason, label.version
    )
    append_one(conn, entry, now=now)


_APPEND = """
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, kind, version, xact_id)
    SELECT shard_key, sm, name, old, new, %(now)s, forced, reason, kind, version,
           pg_current_xact_id()
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(names)s AS text[]), CAST(%(olds)s AS text[]), CAST(%(news)s AS text[]),
                CAST(%(forceds)s AS boolean[]), CAST(%(reasons)s AS text[]),
                CAST(%(kinds)s AS text[]), CAST(%(versions)s AS integer[]))
         AS e(shard_key, sm, name, old, new, forced, reason, kind, version)
    """

_APPEND_ONE = """
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, kind, version, xact_id)
    VALUES (%(shard_key)s, %(sm)s, %(name)s, %(old)s, %(new)s, %(now)s, %(forced)s, %(reason)s,
            %(kind)s, %(version)s, pg_current_xact_id())
    """


# --- create ----------------------------------------------------------------------------------


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
        **label_params(state_machine, name),
        "metadata": json.dumps(metadata),
        "state": state,
        "now": now,
        "due_at": due_at,
        "next_check_at": next_check_at,
        "version": version,
        "history_version": version_for(conn, state_machine, version),
    }
    if distributed(conn):
        row = fetch_one(conn, _INSERT_LABEL, params)
        if row is not None:
            run(conn, _INSERT_FIRST_ENTRY, {**params, "entry_id": row[5]})
    else:
        row = fetch_one(conn, _PREPARED_INSERT, params)
    if row is not None:
        notify_due_times(conn, [due_at], now=now)
    return None if row is None else label_from_row(row)


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

# The API's create, prepared once per connection (see routemaster.db.statements).
_PREPARED_INSERT = Prepared("routemaster_label_insert", _INSERT)


# --- merge metadata --------------------------------------------------------------------------


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
    for the caller to reschedule in the same transaction
    (:func:`routemaster.db.schedules.schedule`).
    """
    params = {
        **label_params(state_machine, name),
        "patch": json.dumps(patch),
        "scheduled_states": list(scheduled_states),
        "now": now,
    }
    statement = _SERIALISED_MERGE_METADATA if serialises(conn) else _MERGE_METADATA
    row = fetch_one(conn, statement, params)
    return None if row is None else label_from_row(row)


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
"""On Citus, the merge: the coordinator takes the transaction id after the worker granted the
row lock, so the UPDATE may take the lock itself."""

_SERIALISED_MERGE_METADATA = """
    UPDATE labels SET metadata = routemaster_deep_merge(metadata, CAST(%(patch)s AS jsonb)),
                      updated_at = %(now)s,
                      scheduled_at = CASE
                          WHEN state = ANY(CAST(%(scheduled_states)s AS text[])) THEN scheduled_at
                          WHEN scheduled_at = updated_at THEN %(now)s
                          ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
      AND pg_advisory_xact_lock(hashtext(%(sm)s), hashtext(%(name)s)) IS NOT NULL
    RETURNING state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
              deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
              version
    """
"""On one server, the merge once the label's writers are serialised (the advisory lock of
:mod:`routemaster.db.labels`, which says why)."""


# --- move ------------------------------------------------------------------------------------
# Every move of the service, whoever decided it (an API update, the worker, an operator), is
# written here. A batch is one statement however many labels move; a single label moving one
# state (the commonest case, an API update) has a plainer statement that PostgreSQL plans in
# half the time.


def write_moves(
    conn: sa.Connection, moves: Sequence[Moves], *, now: datetime.datetime
) -> list[Label]:
    """Append every move to history and put each label in its last state, in one statement.

    Returns the labels as written, in the order of ``moves``.
    """
    moves = [move for move in moves if move.states]
    if not moves:
        return []
    if len(moves) == 1 and (len(moves[0].states) == 1 or distributed(conn)):
        return [_write_one_label(conn, moves[0], now=now)]
    history: dict[str, list[Any]] = {
        key: []
        for key in (
            "m_shard_key",
            "m_sm",
            "m_name",
            "m_old",
            "m_new",
            "m_forced",
            "m_reason",
            "m_version",
        )
    }
    finals: dict[str, list[Any]] = {
        key: [] for key in ("f_shard_key", "f_sm", "f_name", "f_key", "f_due_at", "f_next_check_at")
    }
    for move in moves:
        old = move.label.state
        bucket = shard_key(move.label.name)
        version = version_for(conn, move.label.state_machine, move.label.version)
        for state in move.states:
            history["m_shard_key"].append(bucket)
            history["m_version"].append(version)
            history["m_sm"].append(move.label.state_machine)
            history["m_name"].append(move.label.name)
            history["m_old"].append(old)
            history["m_new"].append(state)
            history["m_forced"].append(move.forced)
            history["m_reason"].append(move.reason)
            old = state
        finals["f_shard_key"].append(bucket)
        finals["f_sm"].append(move.label.state_machine)
        finals["f_name"].append(move.label.name)
        finals["f_key"].append(label_key(move.label.name))
        finals["f_due_at"].append(move.due_at)
        finals["f_next_check_at"].append(move.next_check_at)
    rows = fetch_all(conn, _MOVE_MANY, {"now": now, **history, **finals})
    notify_due_times(conn, finals["f_due_at"], now=now)
    by_key = {(row[0], row[1]): label_from_row(row) for row in rows}
    return [by_key[move.label.key] for move in moves]


def _write_one_label(conn: sa.Connection, move: Moves, *, now: datetime.datetime) -> Label:
    """The commonest write, one label moving one state (an API update), in a plainer statement.

    PostgreSQL plans it in about half the time of the batch statement. On
    Citus a label moving through several states takes it once per state:
    each is a router statement on the label's shard, where the batch
    statement's CTEs are run through intermediate results and commit in two
    phases on both workers.
    """
    label = move.label
    params = {
        "shard_key": shard_key(label.name),
        "sm": label.state_machine,
        "name": label.name,
        "key": label_key(label.name),
        "version": version_for(conn, label.state_machine, label.version),
        "forced": move.forced,
        "reason": move.reason,
        "due_at": move.due_at,
        "next_check_at": move.next_check_at,
        "now": now,
    }
    written, old = label, label.state
    for new in move.states:
        row = fetch_one(conn, _MOVE_ONE, {**params, "old": old, "new": new})
        if row is None:
            raise KeyError(label.key)
        written, old = label_from_row(row), new
    notify_due_times(conn, [move.due_at], now=now)
    return written


# History ids follow the ORDER BY of the INSERT's SELECT, so each label's
# highest new id is its last move: that row becomes its entry.
_MOVE_MANY = """
    WITH moves AS (
        SELECT m.*, ordinality AS seq
        FROM unnest(CAST(%(m_shard_key)s AS integer[]), CAST(%(m_sm)s AS text[]),
                    CAST(%(m_name)s AS text[]), CAST(%(m_old)s AS text[]),
                    CAST(%(m_new)s AS text[]), CAST(%(m_forced)s AS boolean[]),
                    CAST(%(m_reason)s AS text[]), CAST(%(m_version)s AS integer[]))
             WITH ORDINALITY
             AS m(shard_key, state_machine, name, old_state, new_state, forced, reason, version)
    ), entries AS (
        INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created,
                             forced, reason, version, xact_id)
        SELECT shard_key, state_machine, name, old_state, new_state, %(now)s, forced, reason,
               version, pg_current_xact_id()
        FROM moves ORDER BY seq
        RETURNING id, state_machine, label, old_state, new_state
    ), latest AS (
        SELECT DISTINCT ON (state_machine, label) id, state_machine, label, old_state, new_state
        FROM entries ORDER BY state_machine, label, id DESC
    ), finals AS (
        SELECT * FROM unnest(CAST(%(f_shard_key)s AS integer[]), CAST(%(f_sm)s AS text[]),
                             CAST(%(f_name)s AS text[]), CAST(%(f_key)s AS bytea[]),
                             CAST(%(f_due_at)s AS timestamptz[]),
                             CAST(%(f_next_check_at)s AS timestamptz[]))
                 AS f(shard_key, state_machine, name, key, due_at, next_check_at)
    )
    UPDATE labels SET
        state = latest.new_state, previous_state = latest.old_state,
        state_entered_at = %(now)s, entry_id = latest.id, updated_at = %(now)s,
        due_at = finals.due_at, next_check_at = finals.next_check_at, scheduled_at = %(now)s,
        attempts = 0, errored = false, last_error = NULL, lease_owner = NULL
    FROM latest JOIN finals
        ON finals.state_machine = latest.state_machine AND finals.name = latest.label
    WHERE labels.shard_key = ANY(CAST(%(f_shard_key)s AS integer[]))
      AND labels.shard_key = finals.shard_key AND labels.state_machine = finals.state_machine
      AND labels.name_key = finals.key AND labels.name = finals.name
    RETURNING labels.state_machine, labels.name, labels.metadata, labels.state,
              labels.state_entered_at, labels.entry_id, labels.previous_state, labels.deleted,
              labels.paused, labels.errored, labels.last_error, labels.attempts, labels.due_at,
              labels.created_at, labels.updated_at, labels.version
    """

_MOVE_ONE = """
    WITH entry AS (
        INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created,
                             forced, reason, version, xact_id)
        VALUES (%(shard_key)s, %(sm)s, %(name)s, %(old)s, %(new)s, %(now)s, %(forced)s,
                %(reason)s, %(version)s, pg_current_xact_id())
        RETURNING id
    )
    UPDATE labels SET
        state = %(new)s, previous_state = %(old)s,
        state_entered_at = %(now)s, entry_id = entry.id, updated_at = %(now)s,
        due_at = %(due_at)s, next_check_at = %(next_check_at)s, scheduled_at = %(now)s,
        attempts = 0, errored = false, last_error = NULL, lease_owner = NULL
    FROM entry
    WHERE labels.shard_key = %(shard_key)s AND labels.state_machine = %(sm)s
      AND labels.name_key = %(key)s AND labels.name = %(name)s
    RETURNING labels.state_machine, labels.name, labels.metadata, labels.state,
              labels.state_entered_at, labels.entry_id, labels.previous_state, labels.deleted,
              labels.paused, labels.errored, labels.last_error, labels.attempts, labels.due_at,
              labels.created_at, labels.updated_at, labels.version
    """


# --- error ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Erring:
    """A label to error: in the entry it was picked in, with what went wrong."""

    state_machine: str
    name: str
    entry_id: int
    error: str


def become_errored(
    conn: sa.Connection,
    erring: Sequence[Erring],
    *,
    now: datetime.datetime,
    first: bool = False,
) -> list[Label]:
    """Error each label still live, in its entry and not errored: the labels it errored.

    Two statements on every server: the labels' rows (:data:`_ERROR_LABELS`), then their
    history rows (:func:`append`). An error changes neither state nor deletion, so the
    kept counts (folded from history) do not depend on the two being one statement.

    Every path to an error calls it: a webhook given up on (:func:`mark_errored`), a
    pull task failed for the last time or whose lease ran out for the last time
    (``db/tasks.py``), labels left waiting on an open circuit too long
    (``db/receiver_labels.py``). The label's row: errored, not due, its lease and task id
    cleared, the error kept as ``last_error``. Its history entry: ``kind`` ``errored``,
    ``forced`` false, the state as both old and new state, the error as ``reason``, so it
    shows in ``/history`` and on the changes streams; the label's ``entry_id`` (its
    idempotency token) is unchanged.

    ``first``: the transaction reaches these labels first here (it holds none of their
    rows), so on one server their writers are serialised before the rows are locked
    (the condition in ``db/labels.py``). A sweep that picked and holds the rows
    passes ``False``.
    """
    if not erring:
        return []
    names = [each.name for each in erring]
    machines = [each.state_machine for each in erring]
    params = {
        "shard_keys": shard_keys(names),
        "machines": machines,
        "names": names,
        "keys": label_keys(names),
        "entry_ids": [each.entry_id for each in erring],
        "errors": [each.error for each in erring],
        "now": now,
    }
    # The labels, then their history rows, in the caller's transaction: on Citus one label's
    # error is two router statements (a CTE feeding history from the UPDATE would commit in
    # two phases); on one server the second statement costs a round trip on a rare path.
    serialised = first and serialises(conn, len(erring))
    statement = _SERIALISED_ERROR_LABELS if serialised else _ERROR_LABELS
    errored = [label_from_row(row) for row in fetch_all(conn, statement, params)]
    entries = [
        Entry(
            label.state_machine,
            label.name,
            label.state,
            label.state,
            False,
            label.last_error,
            label.version,
            kind="errored",
        )
        for label in errored
    ]
    if len(entries) == 1:
        append_one(conn, entries[0], now=now)
    else:
        append(conn, entries, now=now)
    return errored


def mark_errored(conn: sa.Connection, claim: Claim, *, error: str, now: datetime.datetime) -> bool:
    """Give up on the claimed entry: errored until an operator retries it; whether it was.

    The first write of the caller's transaction (the claim's lease was another's), so the
    label's writers are serialised first (on one server)."""
    erring = Erring(claim.state_machine, claim.name, claim.entry_id, error)
    return bool(become_errored(conn, [erring], now=now, first=True))


# The labels errored, before their history rows (become_errored; the rows' version as
# append gives it): for one label a router statement on Citus.
_ERROR_LABELS = """
    WITH erring AS (
        SELECT * FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                             CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                             CAST(%(entry_ids)s AS bigint[]), CAST(%(errors)s AS text[]))
                      AS e(shard_key, sm, key, name, entry_id, error)
    )
    UPDATE labels SET errored = true, due_at = NULL, last_error = erring.error,
                      lease_owner = NULL, task_id = NULL, updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM erring
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = erring.shard_key AND labels.state_machine = erring.sm
      AND labels.name_key = erring.key AND labels.name = erring.name
      AND labels.entry_id = erring.entry_id AND NOT labels.deleted AND NOT labels.errored
    RETURNING labels.state_machine, labels.name, labels.metadata, labels.state,
              labels.state_entered_at, labels.entry_id, labels.previous_state,
              labels.deleted, labels.paused, labels.errored, labels.last_error,
              labels.attempts, labels.due_at, labels.created_at, labels.updated_at,
              labels.version
    """

# On one server, _ERROR_LABELS once the labels' writers are serialised (become_errored's
# ``first``).
_SERIALISED_ERROR_LABELS = """
    WITH erring AS (
        SELECT * FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                             CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                             CAST(%(entry_ids)s AS bigint[]), CAST(%(errors)s AS text[]))
                      AS e(shard_key, sm, key, name, entry_id, error)
    )
    UPDATE labels SET errored = true, due_at = NULL, last_error = erring.error,
                      lease_owner = NULL, task_id = NULL, updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM erring
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = erring.shard_key AND labels.state_machine = erring.sm
      AND labels.name_key = erring.key AND labels.name = erring.name
      AND labels.entry_id = erring.entry_id AND NOT labels.deleted AND NOT labels.errored
      AND (SELECT count(pg_advisory_xact_lock(in_order.sm_hash, in_order.name_hash))
           FROM (SELECT DISTINCT hashtext(w.sm) AS sm_hash, hashtext(w.name) AS name_hash
                 FROM unnest(CAST(%(machines)s AS text[]), CAST(%(names)s AS text[]))
                      AS w(sm, name)
                 ORDER BY sm_hash, name_hash OFFSET 0) AS in_order) IS NOT NULL
    RETURNING labels.state_machine, labels.name, labels.metadata, labels.state,
              labels.state_entered_at, labels.entry_id, labels.previous_state,
              labels.deleted, labels.paused, labels.errored, labels.last_error,
              labels.attempts, labels.due_at, labels.created_at, labels.updated_at,
              labels.version
    """


# --- retry -----------------------------------------------------------------------------------


def retry(
    conn: sa.Connection, keys: Sequence[LabelKey], *, now: datetime.datetime, reason: str
) -> list[Label]:
    """Make the errored labels of ``keys`` due again now with a fresh attempt count, in one
    statement, each recorded as forced with ``reason``: every retry (an operator's, a bulk
    command's, those of a receiver's errored labels) is this one. Returns the labels
    retried: those still errored and not deleted once the statement holds their row locks
    (one retried or deleted meanwhile is left alone). The idempotency token (``entry_id``)
    is unchanged: it is still the same entry into the action."""
    if not keys:
        return []
    statement = _SERIALISED_RETRY if serialises(conn, len(keys)) else _RETRY
    rows = fetch_all(conn, statement, {**label_key_arrays(keys), "now": now})
    retried = [label_from_row(row) for row in rows]
    entries = [
        Entry(
            label.state_machine, label.name, label.state, label.state, True, reason, label.version
        )
        for label in retried
    ]
    if len(entries) == 1:
        append_one(conn, entries[0], now=now)
    else:
        append(conn, entries, now=now)
    if retried:
        notify_due(conn)
    return retried


_RETRY = """
    UPDATE labels SET errored = false, attempts = 0, due_at = %(now)s, lease_owner = NULL,
                      updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]))
         AS retried(shard_key, sm, key, name)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = retried.shard_key AND labels.state_machine = retried.sm
      AND labels.name_key = retried.key AND labels.name = retried.name
      AND labels.errored AND NOT labels.deleted
    RETURNING labels.state_machine, labels.name, labels.metadata, labels.state,
              labels.state_entered_at, labels.entry_id, labels.previous_state, labels.deleted,
              labels.paused, labels.errored, labels.last_error, labels.attempts, labels.due_at,
              labels.created_at, labels.updated_at, labels.version
    """

# On one server, _RETRY once the labels' writers are serialised: every caller reaches the
# labels first here, or holds their locks already (an operator's retry locked the label).
_SERIALISED_RETRY = """
    UPDATE labels SET errored = false, attempts = 0, due_at = %(now)s, lease_owner = NULL,
                      updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]))
         AS retried(shard_key, sm, key, name)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = retried.shard_key AND labels.state_machine = retried.sm
      AND labels.name_key = retried.key AND labels.name = retried.name
      AND labels.errored AND NOT labels.deleted
      AND (SELECT count(pg_advisory_xact_lock(in_order.sm_hash, in_order.name_hash))
           FROM (SELECT DISTINCT hashtext(w.sm) AS sm_hash, hashtext(w.name) AS name_hash
                 FROM unnest(CAST(%(machines)s AS text[]), CAST(%(names)s AS text[]))
                      AS w(sm, name)
                 ORDER BY sm_hash, name_hash OFFSET 0) AS in_order) IS NOT NULL
    RETURNING labels.state_machine, labels.name, labels.metadata, labels.state,
              labels.state_entered_at, labels.entry_id, labels.previous_state, labels.deleted,
              labels.paused, labels.errored, labels.last_error, labels.attempts, labels.due_at,
              labels.created_at, labels.updated_at, labels.version
    """


# --- pause and resume ------------------------------------------------------------------------


def pause(
    conn: sa.Connection,
    label: Label,
    paused: bool,
    *,
    now: datetime.datetime,
    reason: str,
    until: datetime.datetime | None = None,
) -> Label:
    """Pause (``paused``) or resume the locked ``label``, recorded as forced with ``reason``.

    The pause's end is set either way: ``until`` when pausing (``None``: only when
    resumed), none when resuming. A label already paused (or not) keeps all but that
    end, with no history row.
    """
    end = until if paused else None
    if label.paused == paused:
        run(conn, _SET_PAUSE_END, {**label_params(*label.key), "until": end})
        return label
    record_forced(conn, label, now=now, reason=reason)
    params = {**label_params(*label.key), "paused": paused, "until": end, "now": now}
    row = fetch_one(conn, _SET_PAUSED, params)
    assert row is not None, "the label is locked by the caller"
    updated = label_from_row(row)
    if not paused and updated.due_at is not None:
        notify_due(conn)
    return updated


_SET_PAUSED = """
    UPDATE labels SET paused = %(paused)s, paused_until = %(until)s, lease_owner = NULL,
                      updated_at = %(now)s,
                      scheduled_at = CASE WHEN scheduled_at = updated_at
                                          THEN %(now)s ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    RETURNING state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
              deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
              version
    """

_SET_PAUSE_END = """
    UPDATE labels SET paused_until = %(until)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """


# --- delete (soft) ---------------------------------------------------------------------------


def soft_delete(
    conn: sa.Connection, state_machine: str, name: str, *, now: datetime.datetime
) -> str | None:
    """Clear the metadata and record the deletion; the state it left, or ``None`` if nothing.

    On Citus two router statements in the caller's transaction (:func:`writing`): the
    label's row, locked and marked, then its history row.
    """
    if distributed(conn):
        marked = fetch_one(conn, _MARK_DELETED, {**label_params(state_machine, name), "now": now})
        if marked is None:
            return None
        _, _, state, version = marked
        append_one(
            conn, Entry(state_machine, name, state, None, False, "deleted", version), now=now
        )
        return str(state)
    params = {
        **label_params(state_machine, name),
        **version_params(conn, state_machine),
        "now": now,
    }
    row = fetch_one(conn, _DELETE, params)
    return None if row is None else str(row[0])


def delete_finished(
    conn: sa.Connection,
    state_machine: str,
    end_states: Sequence[str],
    *,
    cutoff: datetime.datetime,
    now: datetime.datetime,
    batch: int,
) -> int:
    """Delete up to ``batch`` labels in an end state since before ``cutoff``: how many.

    Each is deleted as :func:`soft_delete` deletes (its metadata cleared, a history
    entry written, reason :data:`FINISHED_REASON`), so streams and subscriptions see it go.
    Run by retention, in its leader's transaction (:mod:`routemaster.db.retention`).
    """
    params = {
        "sm": state_machine,
        "states": list(end_states),
        "cutoff": cutoff,
        "now": now,
        "batch": batch,
        "reason": FINISHED_REASON,
        "shard_keys": None,
        **version_params(conn, state_machine),
    }
    shards = shard_map(conn)
    if shards is None:
        return run(conn, _DELETE_FINISHED, params)
    done = 0
    found = fetch_all(conn, _FINISHED_KEYS, params)
    for group in shards.whole_shards(conn, [key for (key,) in found]):
        taking = {**params, "batch": batch - done, "shard_keys": group}
        done += shards.run(conn, _DELETE_FINISHED, taking)
        if done >= batch:
            break
    return done


# What every soft delete sets: deleted, metadata cleared, not due, no lease.
# On one server only, once the label's writers are serialised (routemaster/db/labels.py).
_DELETE = """
    WITH deleted AS (
        UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                          lease_owner = NULL, updated_at = %(now)s
        WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
          AND name = %(name)s AND NOT deleted
          AND pg_advisory_xact_lock(hashtext(%(sm)s), hashtext(%(name)s)) IS NOT NULL
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

_MARK_DELETED = """
    UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                      lease_owner = NULL, updated_at = %(now)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
    RETURNING state_machine, name, state, version
    """
"""On Citus, :data:`_DELETE`'s label alone: a router statement before its history row
(:func:`soft_delete`)."""

# As _DELETE, for a batch of labels in an end state since before the cutoff. ``shard_keys``:
# NULL on one server; on Citus every key of one shard, named at each reference to a
# distributed table so that the statement is that shard's (routemaster.db.shards).
_DELETE_FINISHED = """
    WITH done AS MATERIALIZED (
        SELECT shard_key, name_key FROM labels
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND state_machine = %(sm)s AND state = ANY (CAST(%(states)s AS text[]))
          AND NOT deleted AND state_entered_at < %(cutoff)s
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ),
    marked AS (
        UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                          lease_owner = NULL, updated_at = %(now)s
        FROM done
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.shard_key = done.shard_key AND labels.state_machine = %(sm)s
          AND labels.name_key = done.name_key AND NOT labels.deleted
        RETURNING labels.shard_key, labels.state_machine, labels.name, labels.state,
                  labels.version
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, reason,
                         version, xact_id)
    SELECT shard_key, state_machine, name, state, NULL, %(now)s, %(reason)s,
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           pg_current_xact_id()
    FROM marked
    """

# On Citus: a batch's shard keys (which shards to visit).
_FINISHED_KEYS = """
    SELECT shard_key FROM labels
    WHERE state_machine = %(sm)s AND state = ANY (CAST(%(states)s AS text[]))
      AND NOT deleted AND state_entered_at < %(cutoff)s
    LIMIT %(batch)s
    """


# --- upgrade: a label's version and its state's name -----------------------------------------


def set_version(
    conn: sa.Connection, machine: str, name: str, version: int, *, now: datetime.datetime
) -> None:
    """Put a (locked) label on ``version``: what it follows from now on."""
    run(conn, _SET_VERSION, {**label_params(machine, name), "v": version, "now": now})


def rename(
    conn: sa.Connection,
    machine: str,
    name: str,
    *,
    old: str,
    new: str,
    version: int,
    reason: str,
    now: datetime.datetime,
) -> None:
    """A (locked) label's state renamed and its version set, with a forced history row.

    As a configuration's rename: the entry is kept (entered time, attempts,
    due time, idempotency token); the history row carries ``version``.
    """
    params = {
        **label_params(machine, name),
        "old": old,
        "new": new,
        "v": version,
        "reason": reason,
        "now": now,
    }
    run(conn, _RENAME_ONE, params)


def rename_batch(
    conn: sa.Connection,
    machine: str,
    old: str,
    new: str,
    *,
    reason: str,
    now: datetime.datetime,
    limit: int,
    version: int | None = None,
) -> int:
    """Rename up to ``limit`` live labels from ``old`` to ``new``; how many were renamed.

    A configuration's ``migrations:`` rename, one statement per batch: the labels
    change state's name and nothing else (entry, entered time, attempts, due time,
    lease, errored all kept), and each gets a forced history row. Labels locked by
    another transaction, or leased by a worker (a delivery in flight, perhaps by a
    worker running the previous configuration), are skipped: the next pass takes those
    still there. So a webhook in flight is finished by the worker that sent it and never
    sent again. ``version``: only labels that follow it (or keep none): a ``continue``
    machine's older labels keep their states.
    """
    params = {
        "sm": machine,
        "old": old,
        "new": new,
        "reason": reason,
        "now": now,
        "limit": limit,
        "version": version,
        "shard_keys": None,
        **version_params(conn, machine),
    }
    return len(take(conn, _RENAME_KEYS, _RENAME, params))


_SET_VERSION = """
    UPDATE labels SET version = %(v)s, updated_at = %(now)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """

_RENAME_ONE = """
    WITH renamed AS (
        UPDATE labels SET state = %(new)s, version = %(v)s, updated_at = %(now)s
        WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
          AND name = %(name)s AND state = %(old)s
        RETURNING state_machine, name
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    SELECT %(shard_key)s, state_machine, name, %(old)s, %(new)s, %(now)s, true, %(reason)s, %(v)s,
           pg_current_xact_id()
    FROM renamed
    """

# ``shard_keys``: NULL on one server; on Citus every key of one shard, named at each
# reference to labels so that the statement is that shard's (routemaster.db.shards).
_RENAME = """
    WITH batch AS (
        SELECT shard_key, state_machine, name_key FROM labels
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND state_machine = %(sm)s AND state = %(old)s AND NOT deleted
          AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
          AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL
               OR version = %(version)s)
        ORDER BY name_key
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), renamed AS (
        UPDATE labels SET state = %(new)s, updated_at = %(now)s
        FROM batch
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.shard_key = batch.shard_key AND labels.state_machine = batch.state_machine
          AND labels.name_key = batch.name_key
        RETURNING labels.shard_key, labels.state_machine, labels.name, labels.version
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    SELECT shard_key, state_machine, name, %(old)s, %(new)s, %(now)s, true, %(reason)s,
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           pg_current_xact_id()
    FROM renamed
    RETURNING id
    """

# On Citus: the shard keys of a batch, read without a lock across the shards (which shards
# to visit).
_RENAME_KEYS = """
    SELECT shard_key FROM labels
    WHERE state_machine = %(sm)s AND state = %(old)s AND NOT deleted
      AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
      AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL OR version = %(version)s)
    ORDER BY name_key
    LIMIT %(limit)s
    """


# --- a pull task's completion: its lease ended, its metadata merged --------------------------


def complete_tasks(
    conn: sa.Connection,
    completions: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    now: datetime.datetime,
) -> dict[str, Label]:
    """End the live leases among these (task id, metadata patch) and merge each patch.

    Many pull-worker tasks completed at once (``POST /tasks/complete``), in one statement,
    each row fenced exactly as a single completion is (:mod:`routemaster.db.tasks`):
    ``labels.task_id`` is the id, the label is still leased, the lease has not run out;
    the metadata merged as :func:`merge_metadata` merges it. The ids must be distinct.
    Returns, by task id, each label whose lease was live: locked, its lease ended and its
    metadata merged, still in the action and not due (the caller moves it on). Ids absent
    from the answer held no live lease and changed nothing.
    """
    if not completions:
        return {}
    rows = fetch_all(
        conn,
        _COMPLETE_TASKS,
        {
            "ids": [task_id for task_id, _ in completions],
            "patches": [json.dumps(patch) if patch else None for _, patch in completions],
            "now": now,
        },
    )
    return {row[0]: label_from_row(tuple(row[1:])) for row in rows}


# One row per live lease among the ids: the task id, then the label as it is now.
_COMPLETE_TASKS = """
    WITH asked AS (
        SELECT * FROM unnest(CAST(%(ids)s AS text[]), CAST(%(patches)s AS text[]))
                      AS a(id, patch)
    ), taken AS (
        UPDATE labels SET lease_owner = NULL, task_id = NULL, due_at = NULL,
                          updated_at = %(now)s,
                          scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                              THEN %(now)s ELSE labels.scheduled_at END,
                          metadata = CASE WHEN asked.patch IS NULL THEN labels.metadata
                                          ELSE routemaster_deep_merge(labels.metadata,
                                                                      CAST(asked.patch AS jsonb))
                                     END
        FROM asked
        WHERE labels.task_id = asked.id AND labels.lease_owner IS NOT NULL
          AND labels.due_at > %(now)s AND NOT labels.deleted AND NOT labels.errored
        RETURNING asked.id AS task_id, labels.state_machine, labels.name, labels.metadata,
                  labels.state, labels.state_entered_at, labels.entry_id,
                  labels.previous_state, labels.deleted, labels.paused, labels.errored,
                  labels.last_error, labels.attempts, labels.due_at, labels.created_at,
                  labels.updated_at, labels.version
    ), ended AS (
        UPDATE tasks SET ended_at = %(now)s, outcome = 'completed'
        FROM taken WHERE tasks.id = taken.task_id
    )
    SELECT * FROM taken
    """


# --- purge: deleted labels removed with their history (retention) ----------------------------


def purge_deleted(
    conn: sa.Connection, state_machine: str, *, cutoff: datetime.datetime, batch: int
) -> tuple[int, list[str]]:
    """Remove up to ``batch`` labels deleted before ``cutoff``, with their whole history:
    how many labels, and the history positions removed (``xact-id`` texts).

    Run by retention, in its leader's transaction, which records the positions
    (:func:`routemaster.db.retention.remove_deleted`). The name is then free: a POST
    creates it afresh.
    """
    params = {"sm": state_machine, "cutoff": cutoff, "batch": batch, "shard_keys": None}
    shards = shard_map(conn)
    if shards is None:
        row = fetch_one(conn, _REMOVE_DELETED, params)
        assert row is not None  # one row of aggregates
        labels, removed = row
        return int(labels), list(removed or ())
    # Shard by shard (routemaster.db.shards): one row of aggregates from each.
    labels, removed = 0, []
    found = fetch_all(conn, _DELETED_KEYS, params)
    for group in shards.whole_shards(conn, [key for (key,) in found]):
        taking = {**params, "batch": batch - labels, "shard_keys": group}
        [(count, positions)] = shards.fetch_all(conn, _REMOVE_DELETED, taking)
        labels, removed = labels + int(count), removed + list(positions or ())
        if labels >= batch:
            break
    return labels, removed


# Labels deleted before the cutoff (a deleted label is never updated again, so updated_at
# is when it was deleted), oldest first, skipping any the API holds; their rows and their
# whole history go in one statement. ``shard_keys``: NULL on one server; on Citus every key
# of one shard, named at each reference to a distributed table so that the statement is that
# shard's (routemaster.db.shards).
_REMOVE_DELETED = """
    WITH gone AS MATERIALIZED (
        SELECT shard_key, name_key FROM labels
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND state_machine = %(sm)s AND deleted AND updated_at < %(cutoff)s
        ORDER BY updated_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ),
    labels_removed AS (
        DELETE FROM labels USING gone
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.shard_key = gone.shard_key AND labels.state_machine = %(sm)s
          AND labels.name_key = gone.name_key AND labels.deleted
        RETURNING labels.shard_key, labels.name
    ),
    history_removed AS (
        DELETE FROM history USING labels_removed
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR history.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND history.shard_key = labels_removed.shard_key
          AND history.label = labels_removed.name AND history.state_machine = %(sm)s
        RETURNING history.xact_id, history.id
    )
    SELECT (SELECT count(*) FROM labels_removed),
           (SELECT array_agg(CAST(xact_id AS text) || '-' || id) FROM history_removed)
    """

# On Citus: a batch's shard keys (which shards to visit).
_DELETED_KEYS = """
    SELECT shard_key FROM labels
    WHERE state_machine = %(sm)s AND deleted AND updated_at < %(cutoff)s
    ORDER BY updated_at
    LIMIT %(batch)s
    """
