"""The worker's SQL: claiming due labels, recording outcomes, and trigger occurrences.

A label is due when ``due_at <= now``. Claiming an action delivery pushes
``due_at`` one lease into the future and names the worker in ``lease_owner``,
all in one short transaction committed before any HTTP; if the worker dies,
the lease runs out and the label is due again. Rows are picked with
``FOR UPDATE SKIP LOCKED`` so concurrent workers never take the same label.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.labels import LABEL_COLUMNS, Label

StateKey = tuple[str, str]
"""(state machine, state), or (state machine, label name), as the query says."""


@dataclass(frozen=True)
class Claim:
    """An action delivery this worker owns until ``lease_until``."""

    state_machine: str
    name: str
    state: str
    metadata: dict[str, Any]
    entry_id: int
    attempts: int  # including this one


def claim_actions(
    conn: sa.Connection,
    action_states: Sequence[StateKey],
    *,
    limit: int,
    now: datetime.datetime,
    lease_until: datetime.datetime,
    worker_id: str,
) -> list[Claim]:
    """Lease up to ``limit`` due labels sitting in action states, oldest first."""
    if limit <= 0 or not action_states:
        return []
    machines, states = _unzip(action_states)
    rows = conn.execute(
        _CLAIM_ACTIONS,
        {
            "now": now,
            "limit": limit,
            "lease_until": lease_until,
            "me": worker_id,
            "machines": machines,
            "states": states,
        },
    ).all()
    return [Claim(**row._mapping) for row in rows]


def lock_due_gates(
    conn: sa.Connection,
    gate_states: Sequence[StateKey],
    *,
    limit: int,
    now: datetime.datetime,
) -> list[Label]:
    """Lock up to ``limit`` due labels in ``gate_states``, for evaluation in ``conn``.

    Only states this worker's configuration knows are taken, so during a
    rolling deploy an old worker never mistakes a new state for something
    with nothing to do.
    """
    if limit <= 0 or not gate_states:
        return []
    machines, states = _unzip(gate_states)
    rows = conn.execute(
        _LOCK_GATES, {"now": now, "limit": limit, "machines": machines, "states": states}
    ).all()
    return [Label(**row._mapping) for row in rows]


def clear_due(conn: sa.Connection, labels: Iterable[StateKey]) -> None:
    """Nothing more to do for these labels until a trigger or update makes them due."""
    machines, names = _unzip(labels)
    if names:
        conn.execute(_CLEAR_DUE, {"machines": machines, "names": names})


def lease(
    conn: sa.Connection,
    labels: Iterable[StateKey],
    *,
    lease_until: datetime.datetime,
    worker_id: str,
) -> None:
    """Lease already-locked labels (gates whose evaluation must fetch feeds over HTTP)."""
    machines, names = _unzip(labels)
    if names:
        conn.execute(
            _LEASE,
            {"machines": machines, "names": names, "lease_until": lease_until, "me": worker_id},
        )


def record_retry(
    conn: sa.Connection,
    claim: Claim,
    *,
    due_at: datetime.datetime,
    error: str,
    worker_id: str,
) -> bool:
    """A failed attempt: due again at ``due_at``, unless the label moved or was re-claimed."""
    result = conn.execute(
        _RECORD_RETRY,
        {
            "sm": claim.state_machine,
            "name": claim.name,
            "entry_id": claim.entry_id,
            "due_at": due_at,
            "error": error,
            "me": worker_id,
        },
    )
    return result.rowcount == 1


def record_errored(conn: sa.Connection, claim: Claim, *, error: str) -> bool:
    """Give up: the label stays in its action, visibly errored, until an operator retries it."""
    result = conn.execute(
        _RECORD_ERRORED,
        {"sm": claim.state_machine, "name": claim.name, "entry_id": claim.entry_id, "error": error},
    )
    return result.rowcount == 1


def record_evaluation_error(
    conn: sa.Connection, label: StateKey, *, due_at: datetime.datetime, error: str
) -> None:
    """An evaluation failed unexpectedly: keep the label due later with the error visible."""
    conn.execute(
        _RECORD_EVALUATION_ERROR,
        {"sm": label[0], "name": label[1], "due_at": due_at, "error": error},
    )


def record_occurrence(conn: sa.Connection, trigger_key: str, occurrence: datetime.datetime) -> bool:
    """Whether this call is the first, across all workers, to handle the occurrence."""
    result = conn.execute(_RECORD_OCCURRENCE, {"key": trigger_key, "occurrence": occurrence})
    return result.rowcount == 1


def mark_gate_due(
    conn: sa.Connection,
    state_machine: str,
    state: str,
    *,
    now: datetime.datetime,
    zone_path: Sequence[str] | None = None,
    zone: str | None = None,
) -> int:
    """Make every label in the gate due now (only those whose metadata names ``zone``, if given).

    One set-based statement, so the number of labels costs the database
    work but never worker memory. Labels already leased to a worker are
    being processed and are left alone.
    """
    params: dict[str, Any] = {"sm": state_machine, "state": state, "now": now}
    if zone_path is None:
        statement = _MARK_GATE_DUE
    else:
        statement = _MARK_GATE_DUE_IN_ZONE
        params.update(path=list(zone_path), zone=zone)
    return conn.execute(statement, params).rowcount


def zones_in_gate(
    conn: sa.Connection, state_machine: str, state: str, path: Sequence[str]
) -> list[str]:
    """The distinct values at metadata ``path`` among labels in the gate."""
    rows = conn.execute(
        _ZONES_IN_GATE, {"sm": state_machine, "state": state, "path": list(path)}
    ).all()
    return [row.zone for row in rows]


def forget_occurrences(conn: sa.Connection, before: datetime.datetime) -> None:
    """Old occurrences can never be computed again, so their rows only take space."""
    conn.execute(_FORGET_OCCURRENCES, {"before": before})


def _unzip(pairs: Iterable[StateKey]) -> tuple[list[str], list[str]]:
    firsts: list[str] = []
    seconds: list[str] = []
    for first, second in pairs:
        firsts.append(first)
        seconds.append(second)
    return firsts, seconds


_STATES = "SELECT * FROM unnest(CAST(:machines AS text[]), CAST(:states AS text[]))"
_NAMES = "SELECT * FROM unnest(CAST(:machines AS text[]), CAST(:names AS text[]))"
_CLAIMABLE = "due_at <= :now AND NOT deleted AND NOT paused AND NOT errored"

_CLAIM_ACTIONS = sa.text(
    f"""
    WITH due AS (
        SELECT state_machine, name FROM labels
        WHERE {_CLAIMABLE} AND (state_machine, state) IN ({_STATES})
        ORDER BY due_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE labels SET due_at = :lease_until, lease_owner = :me, attempts = labels.attempts + 1
    FROM due
    WHERE labels.state_machine = due.state_machine AND labels.name = due.name
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts
    """
)

_LOCK_GATES = sa.text(
    f"""
    SELECT {LABEL_COLUMNS} FROM labels
    WHERE {_CLAIMABLE} AND (state_machine, state) IN ({_STATES})
    ORDER BY due_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

_CLEAR_DUE = sa.text(
    f"""
    UPDATE labels SET due_at = NULL, attempts = 0, last_error = NULL, lease_owner = NULL
    WHERE (state_machine, name) IN ({_NAMES})
    """
)

_LEASE = sa.text(
    f"""
    UPDATE labels SET due_at = :lease_until, lease_owner = :me, attempts = attempts + 1
    WHERE (state_machine, name) IN ({_NAMES})
    """
)

_RECORD_RETRY = sa.text(
    """
    UPDATE labels SET due_at = :due_at, last_error = :error, lease_owner = NULL
    WHERE state_machine = :sm AND name = :name AND entry_id = :entry_id
      AND lease_owner = :me AND NOT deleted AND NOT errored
    """
)

_RECORD_ERRORED = sa.text(
    """
    UPDATE labels SET errored = true, due_at = NULL, last_error = :error, lease_owner = NULL,
                      updated_at = now()
    WHERE state_machine = :sm AND name = :name AND entry_id = :entry_id AND NOT deleted
    """
)

_RECORD_EVALUATION_ERROR = sa.text(
    """
    UPDATE labels SET due_at = :due_at, last_error = :error, lease_owner = NULL
    WHERE state_machine = :sm AND name = :name
    """
)

_RECORD_OCCURRENCE = sa.text(
    """
    INSERT INTO trigger_occurrences (trigger_key, occurrence) VALUES (:key, :occurrence)
    ON CONFLICT DO NOTHING
    """
)

_GATE_LABELS = (
    "state_machine = :sm AND state = :state AND NOT deleted AND NOT paused AND NOT errored"
    " AND lease_owner IS NULL AND (due_at IS NULL OR due_at > :now)"
)

_MARK_GATE_DUE = sa.text(f"UPDATE labels SET due_at = :now WHERE {_GATE_LABELS}")

_MARK_GATE_DUE_IN_ZONE = sa.text(
    f"""
    UPDATE labels SET due_at = :now
    WHERE {_GATE_LABELS} AND metadata #>> CAST(:path AS text[]) = :zone
    """
)

_ZONES_IN_GATE = sa.text(
    """
    SELECT DISTINCT metadata #>> CAST(:path AS text[]) AS zone FROM labels
    WHERE state_machine = :sm AND state = :state AND NOT deleted
      AND metadata #>> CAST(:path AS text[]) IS NOT NULL
    """
)

_FORGET_OCCURRENCES = sa.text("DELETE FROM trigger_occurrences WHERE occurrence < :before")
