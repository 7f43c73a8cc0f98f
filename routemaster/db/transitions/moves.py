"""Moves: every move of the service, whoever decided it (an API update, the worker, an
operator), with its history rows."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import RETURNED_FROM_LABELS
from routemaster.db.history import version_for
from routemaster.db.keys import label_key, shard_key
from routemaster.db.labels import Label, Moves, label_from_row
from routemaster.db.notifications import notify_due_times
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import fetch_all, fetch_one, fetch_value, on_a_node

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
    phases on both workers. On a Citus node (a write routed there:
    :func:`routemaster.db.nodes.writing_near`) the history row and the label's
    row are two statements: the node would send itself the history row's id
    as an intermediate result, over a connection to itself, and commit in
    two phases with itself.
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
        if on_a_node(conn):
            entry = fetch_value(conn, _MOVE_ONE_ENTRY, {**params, "old": old, "new": new})
            row = fetch_one(
                conn, _MOVE_ONE_LABEL, {**params, "old": old, "new": new, "entry_id": entry}
            )
        else:
            row = fetch_one(conn, _MOVE_ONE, {**params, "old": old, "new": new})
        if row is None:
            raise KeyError(label.key)
        written, old = label_from_row(row), new
    notify_due_times(conn, [move.due_at], now=now)
    return written


# History ids follow the ORDER BY of the INSERT's SELECT, so each label's
# highest new id is its last move: that row becomes its entry.
_MOVE_MANY = f"""
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
               version, routemaster_xact_id()
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
    RETURNING {RETURNED_FROM_LABELS}
    """

_MOVE_ONE = f"""
    WITH entry AS (
        INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created,
                             forced, reason, version, xact_id)
        VALUES (%(shard_key)s, %(sm)s, %(name)s, %(old)s, %(new)s, %(now)s, %(forced)s,
                %(reason)s, %(version)s, routemaster_xact_id())
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
    RETURNING {RETURNED_FROM_LABELS}
    """

# _MOVE_ONE on a Citus node, as two statements: the history row ...
_MOVE_ONE_ENTRY = """
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    VALUES (%(shard_key)s, %(sm)s, %(name)s, %(old)s, %(new)s, %(now)s, %(forced)s, %(reason)s,
            %(version)s, routemaster_xact_id())
    RETURNING id
    """

# ... then the label's row, in the state that history row entered.
_MOVE_ONE_LABEL = f"""
    UPDATE labels SET
        state = %(new)s, previous_state = %(old)s,
        state_entered_at = %(now)s, entry_id = %(entry_id)s, updated_at = %(now)s,
        due_at = %(due_at)s, next_check_at = %(next_check_at)s, scheduled_at = %(now)s,
        attempts = 0, errored = false, last_error = NULL, lease_owner = NULL
    WHERE labels.shard_key = %(shard_key)s AND labels.state_machine = %(sm)s
      AND labels.name_key = %(key)s AND labels.name = %(name)s
    RETURNING {RETURNED_FROM_LABELS}
    """
