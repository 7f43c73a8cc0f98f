"""A label becoming errored: the one statement every path to it runs.

A webhook given up on (:func:`mark_errored`), a pull task failed for the last
time or whose lease ran out for the last time (``db/tasks.py``), labels left
waiting on an open circuit too long (``db/receiver_labels.py``): each picks
its labels and then calls :func:`become_errored`, so what becoming errored
means is written once. The label's row: errored, not due, its lease and task
id cleared, the error kept as ``last_error``. Its history entry: ``kind``
``errored``, ``forced`` false, the state as both old and new state, the error
as ``reason``, so it shows in ``/history`` and on the changes streams; the
label's ``entry_id`` (its idempotency token) is unchanged. Only a live label
still in the entry it was picked in, and not errored already, becomes errored.
The labels' shard keys are named (``= ANY(...)``): on Citus the statement
runs on their shards only; the history rows are written as
:mod:`routemaster.db.history` says.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db import history as history_rows
from routemaster.db.claimed import Claim
from routemaster.db.history import version_arrays
from routemaster.db.keys import label_keys, shard_keys
from routemaster.db.labels import Label, label_from_row
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import fetch_all


@dataclass(frozen=True)
class Erring:
    """A label to error: in the entry it was picked in, with what went wrong."""

    state_machine: str
    name: str
    entry_id: int
    error: str


# On Citus, _BECOME_ERRORED's labels alone: a router statement for one label, before its
# history row (become_errored; the row's version as history.append_one gives it).
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

_BECOME_ERRORED = """
    WITH erring AS (
        SELECT * FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                             CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                             CAST(%(entry_ids)s AS bigint[]), CAST(%(errors)s AS text[]),
                             CAST(%(runnings)s AS integer[]), CAST(%(continuings)s AS boolean[]))
                      AS e(shard_key, sm, key, name, entry_id, error, running, continuing)
    ), errored AS (
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
                  labels.version, labels.shard_key,
                  CASE WHEN erring.continuing THEN COALESCE(labels.version, erring.running)
                       ELSE erring.running END AS history_version
    ), entries AS (
        INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created,
                             forced, reason, kind, version, xact_id)
        SELECT shard_key, state_machine, name, state, state, %(now)s, false, last_error,
               'errored', history_version, pg_current_xact_id()
        FROM errored
    )
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM errored
    """


def become_errored(
    conn: sa.Connection, erring: Sequence[Erring], *, now: datetime.datetime
) -> list[Label]:
    """Error each label still live, in its entry and not errored: the labels it errored."""
    if not erring:
        return []
    names = [each.name for each in erring]
    machines = [each.state_machine for each in erring]
    params = {
        **version_arrays(conn, machines),
        "shard_keys": shard_keys(names),
        "machines": machines,
        "names": names,
        "keys": label_keys(names),
        "entry_ids": [each.entry_id for each in erring],
        "errors": [each.error for each in erring],
        "now": now,
    }
    if not distributed(conn):
        return [label_from_row(row) for row in fetch_all(conn, _BECOME_ERRORED, params)]
    # On Citus the labels, then their history rows: one label's error is two router
    # statements (the CTE feeding history from the UPDATE committed in two phases).
    errored = [label_from_row(row) for row in fetch_all(conn, _ERROR_LABELS, params)]
    entries = [
        history_rows.Entry(
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
        history_rows.append_one(conn, entries[0], now=now)
    else:
        history_rows.append(conn, entries, now=now)
    return errored


def mark_errored(conn: sa.Connection, claim: Claim, *, error: str, now: datetime.datetime) -> bool:
    """Give up on the claimed entry: errored until an operator retries it; whether it was."""
    erring = Erring(claim.state_machine, claim.name, claim.entry_id, error)
    return bool(become_errored(conn, [erring], now=now))
