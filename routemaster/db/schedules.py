"""Each waiting label's next check and due time (SPEC E1): the statements that keep them.

A label in a gate evaluated at moments carries ``next_check_at`` (the earliest
moment its exit condition could hold) and ``due_at`` (when the worker
evaluates it). ``scheduled_at`` is ``updated_at`` as it was when both were
computed; rows written since by something that did not compute them are
listed by the partial index ``labels_unscheduled`` (migration 0012).

These writes say when a label is next looked at, not what it is (transitions:
``db/transitions.py``) nor which labels are picked (``db/label_claims.py``); an
evaluation's end clears ``lease_owner`` in the same write, its new due time
replacing the lease's.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import NAMED_KEYS, named_by
from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.labels import LabelKey, label_params
from routemaster.db.notifications import notify_due
from routemaster.db.statements import fetch_all, fetch_one, run


@dataclass(frozen=True)
class Schedule:
    """One label's next check and due time, computed for its entry ``entry_id`` (SPEC E1)."""

    key: LabelKey
    entry_id: int
    next_check_at: datetime.datetime | None
    due_at: datetime.datetime | None


def settle_unmoved(conn: sa.Connection, schedules: Sequence[Schedule]) -> None:
    """Evaluated and not moved: nothing to do until their next due time (``None``: an update).

    A row that already holds exactly this is not written at all, so a
    label evaluated at its next check that stays where it is costs no write.
    """
    if schedules:
        run(conn, _SETTLE_UNMOVED, _schedule_arrays(schedules))


def schedule(conn: sa.Connection, schedules: Sequence[Schedule], *, now: datetime.datetime) -> None:
    """Store next checks and due times computed after an update or for a row that had none.

    A label leased to a worker (its evaluation in flight) is left alone: it is
    settled when that evaluation ends. Workers are woken only for labels due
    already; a later due time is found by their next look at the queue.
    """
    if schedules:
        run(conn, _SCHEDULE, _schedule_arrays(schedules))
        if any(s.due_at is not None and s.due_at <= now for s in schedules):
            notify_due(conn)


def clear_due(conn: sa.Connection, keys: Iterable[LabelKey]) -> None:
    """Nothing more to do for these labels (an action with no ``next``) until someone acts."""
    params = label_key_arrays(keys)
    if params["names"]:
        run(conn, _CLEAR_DUE, params)


def mark_due(conn: sa.Connection, key: LabelKey, *, at: datetime.datetime) -> None:
    """An evaluation is owed by ``at`` (or sooner, if it already was)."""
    run(conn, _MARK_DUE, {**label_params(*key), "at": at})


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
        {**label_params(*key), "entry_id": entry_id, "error": error, "due_at": due_at},
    )


def count_unscheduled(conn: sa.Connection) -> int:
    """Live rows whose schedule is not computed yet (the index's size): for progress."""
    return int(fetch_one(conn, _COUNT_UNSCHEDULED)[0])  # type: ignore[index]


def next_check_of(conn: sa.Connection, key: LabelKey) -> datetime.datetime | None:
    """The stored next check of one label (``None``: none, or not computed yet)."""
    params = {
        "sm": key[0],
        "name": key[1],
        "key": label_key(key[1]),
        "shard_key": shard_key(key[1]),
    }
    row = fetch_one(conn, _NEXT_CHECK, params)
    return None if row is None else row[0]


@dataclass(frozen=True)
class NextMove:
    """A label waiting in a gate, with when the worker evaluates it and its next check."""

    name: str
    due_at: datetime.datetime
    next_check_at: datetime.datetime | None


def next_moves(
    conn: sa.Connection, state_machine: str, state: str, *, limit: int
) -> list[NextMove]:
    """The gate's labels the worker evaluates soonest (index ``labels_claimable``)."""
    params = {"sm": state_machine, "state": state, "limit": limit}
    return [NextMove(*row) for row in fetch_all(conn, _NEXT_MOVES, params)]


def _schedule_arrays(schedules: Sequence[Schedule]) -> dict[str, Any]:
    return {
        **label_key_arrays(s.key for s in schedules),
        "entries": [s.entry_id for s in schedules],
        "next_checks": [s.next_check_at for s in schedules],
        "dues": [s.due_at for s in schedules],
    }


_CLEAR_DUE = f"""
    UPDATE labels SET due_at = NULL, attempts = 0, last_error = NULL, lease_owner = NULL
    FROM unnest({NAMED_KEYS})
         AS done(shard_key, sm, key, name)
    WHERE {named_by("done")}
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

# Evaluated without moving: the new schedule, and a clean slate of attempts; rows that
# already hold all of it are not written (no new row version, no WAL).
_SETTLE_UNMOVED = f"""
    UPDATE labels SET next_check_at = done.next_check_at, due_at = done.due_at,
                      scheduled_at = labels.updated_at,
                      attempts = 0, last_error = NULL, lease_owner = NULL
    FROM unnest({NAMED_KEYS},
                CAST(%(entries)s AS bigint[]), CAST(%(next_checks)s AS timestamptz[]),
                CAST(%(dues)s AS timestamptz[]))
         AS done(shard_key, sm, key, name, entry_id, next_check_at, due_at)
    WHERE {named_by("done")} AND labels.entry_id = done.entry_id
      AND (labels.next_check_at IS DISTINCT FROM done.next_check_at
           OR labels.due_at IS DISTINCT FROM done.due_at
           OR labels.scheduled_at IS DISTINCT FROM labels.updated_at
           OR labels.attempts <> 0 OR labels.last_error IS NOT NULL
           OR labels.lease_owner IS NOT NULL)
    """

_SCHEDULE = f"""
    UPDATE labels SET next_check_at = computed.next_check_at, due_at = computed.due_at,
                      scheduled_at = labels.updated_at
    FROM unnest({NAMED_KEYS},
                CAST(%(entries)s AS bigint[]), CAST(%(next_checks)s AS timestamptz[]),
                CAST(%(dues)s AS timestamptz[]))
         AS computed(shard_key, sm, key, name, entry_id, next_check_at, due_at)
    WHERE {named_by("computed")} AND labels.entry_id = computed.entry_id
      AND labels.lease_owner IS NULL
    """


_COUNT_UNSCHEDULED = """
    SELECT count(*) FROM labels WHERE NOT deleted AND scheduled_at IS DISTINCT FROM updated_at
    """

_NEXT_MOVES = """
    SELECT name, due_at, next_check_at FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND lease_owner IS NULL
      AND due_at IS NOT NULL AND NOT deleted AND NOT paused AND NOT errored
    ORDER BY due_at
    LIMIT %(limit)s
    """

_NEXT_CHECK = """
    SELECT next_check_at FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """
