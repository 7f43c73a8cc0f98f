"""Completed pull-worker tasks: which ids were issued, and the durations of completed ones.

Completing many at once (their leases ended, their metadata merged) is a
label transition: :func:`routemaster.db.transitions.complete_tasks`. ``recent_durations``
reads, per pull action, the claim-to-completion durations of its latest
completed tasks from the ``tasks_completed`` index, for percentile leases.
Statements are written and run as :mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import fetch_all

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
