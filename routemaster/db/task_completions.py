"""Completing many pull-worker tasks at once, and the durations of completed ones.

``take_completed`` ends the live leases of a batch of task ids and merges
each one's metadata in one statement, each row fenced exactly as a single
completion is (:mod:`routemaster.db.tasks`): ``labels.task_id`` is the id,
the label is still leased, the lease has not run out. ``recent_durations``
reads, per pull action, the claim-to-completion durations of its latest
completed tasks from the ``tasks_completed`` index, for percentile leases.
Statements are written and run as :mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from routemaster.db.labels import Label, label_from_row
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import fetch_all

RECENT = 100  # completions a percentile lease is taken over


def take_completed(
    conn: sa.Connection,
    completions: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    now: datetime.datetime,
) -> dict[str, Label]:
    """End the live leases among these (task id, metadata patch) and merge each patch.

    The ids must be distinct. Returns, by task id, each label whose lease was
    live: locked, its lease ended and its metadata merged, still in the
    action and not due (the caller moves it on). Ids absent from the answer
    held no live lease and changed nothing.
    """
    if not completions:
        return {}
    rows = fetch_all(
        conn,
        _TAKE_COMPLETED,
        {
            "ids": [task_id for task_id, _ in completions],
            "patches": [json.dumps(patch) if patch else None for _, patch in completions],
            "now": now,
        },
    )
    return {row[0]: label_from_row(tuple(row[1:])) for row in rows}


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


# One row per live lease among the ids: the task id, then the label as it is now.
_TAKE_COMPLETED = """
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
