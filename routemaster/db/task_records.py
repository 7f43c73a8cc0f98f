"""What is known of pull-worker tasks: who holds a label now, a label's past tasks,
tasks in flight per action, and forgetting old ones (for explanations, the console and
the worker). The leases themselves are :mod:`routemaster.db.tasks`."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import sqlalchemy as sa


@dataclass(frozen=True)
class TaskInfo:
    """A label's current lease, for explanations."""

    id: str
    worker: str
    attempt: int
    claimed_at: datetime.datetime
    lease_expires_at: datetime.datetime


def forget_before(conn: sa.Connection, before: datetime.datetime, *, limit: int) -> int:
    """Delete up to ``limit`` tasks claimed before ``before``, except labels' current ones."""
    return conn.execute(_FORGET, {"before": before, "limit": limit}).rowcount


def current(
    conn: sa.Connection, state_machine: str, name: str, *, now: datetime.datetime
) -> TaskInfo | None:
    """The label's live lease, if a task holds it (for explanations)."""
    row = conn.execute(_CURRENT, {"sm": state_machine, "name": name, "now": now}).one_or_none()
    return TaskInfo(**row._mapping) if row is not None else None


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
    rows = conn.execute(_OF_LABEL, {"sm": state_machine, "name": name, "limit": limit}).all()
    return [PastTask(**row._mapping) for row in reversed(rows)]


def in_flight(conn: sa.Connection, *, now: datetime.datetime) -> dict[tuple[str, str], int]:
    """Live leases held by tasks, per (state machine, state)."""
    rows = conn.execute(_IN_FLIGHT, {"now": now}).all()
    return {(row.state_machine, row.state): row.held for row in rows}


_FORGET = sa.text(
    """
    DELETE FROM tasks WHERE id IN (
        SELECT id FROM tasks
        WHERE claimed_at < :before
          AND NOT EXISTS (SELECT 1 FROM labels WHERE labels.task_id = tasks.id)
        ORDER BY claimed_at
        LIMIT :limit
    )
    """
)

_CURRENT = sa.text(
    """
    SELECT tasks.id, tasks.worker, tasks.attempt, tasks.claimed_at,
           labels.due_at AS lease_expires_at
    FROM labels JOIN tasks ON tasks.id = labels.task_id
    WHERE labels.state_machine = :sm AND labels.name_key = routemaster_label_key(:name)
      AND labels.name = :name AND labels.lease_owner IS NOT NULL AND labels.due_at > :now
    """
)

_OF_LABEL = sa.text(
    """
    SELECT state, entry_id, attempt, worker, claimed_at, ended_at, outcome FROM tasks
    WHERE label = :name AND state_machine = :sm
    ORDER BY claimed_at DESC, attempt DESC
    LIMIT :limit
    """
)

_IN_FLIGHT = sa.text(
    """
    SELECT state_machine, state, count(*) AS held FROM labels
    WHERE lease_owner IS NOT NULL AND due_at > :now AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
    GROUP BY state_machine, state
    """
)
