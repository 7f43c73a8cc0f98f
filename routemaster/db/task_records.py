"""What is known of pull-worker tasks, read from ``tasks``: who holds a label now, a label's
past tasks, tasks in flight per action, forgetting old ones (for explanations, the console
and the worker); which ids were issued, and the claim-to-completion durations of each pull
action's latest completed tasks (from the ``tasks_completed`` index, for percentile leases).

The leases themselves are :mod:`routemaster.db.tasks`; completing many at once (their
leases ended, their metadata merged) is a label transition,
:func:`routemaster.db.transitions.complete_tasks`. Statements are written and run as
:mod:`routemaster.db.statements` says."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.keys import label_key, shard_key
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import fetch_all, fetch_one, run


@dataclass(frozen=True)
class TaskInfo:
    """A label's current lease, for explanations."""

    id: str
    worker: str
    attempt: int
    claimed_at: datetime.datetime
    lease_expires_at: datetime.datetime
    lease: datetime.timedelta  # set at the claim
    lease_source: str | None  # fixed, percentile, min or max (None: claimed before 0016)
    lease_samples: int | None


def forget_before(conn: sa.Connection, before: datetime.datetime, *, limit: int) -> int:
    """Delete up to ``limit`` tasks claimed before ``before``, except labels' current ones."""
    return run(conn, _FORGET, {"before": before, "limit": limit})


def current(
    conn: sa.Connection, state_machine: str, name: str, *, now: datetime.datetime
) -> TaskInfo | None:
    """The label's live lease, if a task holds it (for explanations)."""
    params = {
        "sm": state_machine,
        "name": name,
        "key": label_key(name),
        "shard_key": shard_key(name),
        "now": now,
    }
    row = fetch_one(conn, _CURRENT, params)
    return None if row is None else TaskInfo(*row)


@dataclass(frozen=True)
class PastTask:
    """One attempt at a label's action by a task: who, when, and how it ended."""

    state: str
    entry_id: int
    attempt: int
    worker: str
    claimed_at: datetime.datetime
    ended_at: datetime.datetime | None
    outcome: str | None  # completed, failed, released, expired; None: open or superseded


def of_label(conn: sa.Connection, state_machine: str, name: str, *, limit: int) -> list[PastTask]:
    """The label's latest ``limit`` tasks, oldest first."""
    params = {"sm": state_machine, "name": name, "shard_key": shard_key(name), "limit": limit}
    rows = fetch_all(conn, _OF_LABEL, params)
    return [PastTask(*row) for row in reversed(rows)]


_FORGET = """
    DELETE FROM tasks WHERE (shard_key, id) IN (
        SELECT shard_key, id FROM tasks
        WHERE claimed_at < %(before)s
          AND NOT EXISTS (SELECT 1 FROM labels
                          WHERE labels.shard_key = tasks.shard_key AND labels.task_id = tasks.id)
        ORDER BY claimed_at
        LIMIT %(limit)s
    )
    """

_CURRENT = """
    SELECT tasks.id, tasks.worker, tasks.attempt, tasks.claimed_at,
           labels.due_at AS lease_expires_at, tasks.lease, tasks.lease_source,
           tasks.lease_samples
    FROM labels JOIN tasks ON tasks.shard_key = labels.shard_key AND tasks.id = labels.task_id
    WHERE labels.shard_key = %(shard_key)s AND labels.state_machine = %(sm)s
      AND labels.name_key = %(key)s
      AND labels.name = %(name)s AND labels.lease_owner IS NOT NULL AND labels.due_at > %(now)s
    """

_OF_LABEL = """
    SELECT state, entry_id, attempt, worker, claimed_at, ended_at, outcome FROM tasks
    WHERE shard_key = %(shard_key)s AND label = %(name)s AND state_machine = %(sm)s
    ORDER BY claimed_at DESC, attempt DESC
    LIMIT %(limit)s
    """


RECENT = 100  # completions a percentile lease is taken over


def issued_among(conn: sa.Connection, task_ids: Sequence[str]) -> set[str]:
    """Which of ``task_ids`` were ever issued (a stale id: 409; never issued: 404)."""
    if not task_ids:
        return set()
    return {row[0] for row in fetch_all(conn, _ISSUED_AMONG, {"ids": list(task_ids)})}


def recent_durations(
    conn: sa.Connection, states: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], list[float]]:
    """Per (state machine, pull action): the claim-to-completion seconds of its latest
    ``RECENT`` tasks ended by a completion (not failed, released or expired)."""
    if not states:
        return {}
    if distributed(conn):
        return {
            (machine, state): [
                seconds
                for (seconds,) in fetch_all(
                    conn, _RECENT_DURATIONS_OF, {"sm": machine, "state": state, "limit": RECENT}
                )
            ]
            for machine, state in states
        }
    rows = fetch_all(
        conn,
        _RECENT_DURATIONS,
        {
            "machines": [machine for machine, _ in states],
            "states": [state for _, state in states],
            "limit": RECENT,
        },
    )
    return {(machine, state): list(seconds or ()) for machine, state, seconds in rows}


_ISSUED_AMONG = "SELECT id FROM tasks WHERE id = ANY(CAST(%(ids)s AS text[]))"

_RECENT_DURATIONS = """
    SELECT asked.state_machine, asked.state, recent.seconds
    FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[]))
         AS asked(state_machine, state)
    CROSS JOIN LATERAL (
        SELECT array_agg(latest.seconds) AS seconds FROM (
            SELECT CAST(extract(epoch FROM tasks.ended_at - tasks.claimed_at)
                        AS double precision) AS seconds
            FROM tasks
            WHERE tasks.state_machine = asked.state_machine AND tasks.state = asked.state
              AND tasks.outcome = 'completed'
            ORDER BY tasks.ended_at DESC
            LIMIT %(limit)s
        ) AS latest
    ) AS recent
    """

# On Citus a LATERAL subquery with a LIMIT over a distributed table is refused: one pull action
# at a time instead, each an ORDER BY ... LIMIT that every shard answers from its index.
_RECENT_DURATIONS_OF = """
    SELECT CAST(extract(epoch FROM ended_at - claimed_at) AS double precision)
    FROM tasks
    WHERE state_machine = %(sm)s AND state = %(state)s AND outcome = 'completed'
    ORDER BY ended_at DESC
    LIMIT %(limit)s
    """
