"""The worker's due work: claiming it, leasing it, and recording what came of it.

A label is due when ``due_at <= now``. Claiming pushes ``due_at`` one lease
into the future and names the worker in ``lease_owner``, in one short
transaction committed before any HTTP; the worker renews the lease while the
work is in flight, and if the worker dies the lease runs out and the label is
due again. Rows are picked with ``FOR UPDATE SKIP LOCKED`` so concurrent
workers never take the same label.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.keys import label_key, label_keys
from routemaster.db.labels import _COLUMNS, LIVE, Label, LabelKey, _keys, _label

StateKey = tuple[str, str]
"""(state machine, state)."""


@dataclass(frozen=True)
class Claim:
    """One leased piece of work, in one shape from the claim to its outcome."""

    state_machine: str
    name: str
    state: str
    metadata: dict[str, Any]
    entry_id: int
    attempts: int  # including this one

    @property
    def key(self) -> LabelKey:
        return (self.state_machine, self.name)

    @property
    def entry(self) -> tuple[str, str, int]:
        return (self.state_machine, self.name, self.entry_id)


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
    rows = conn.execute(
        _CLAIM_ACTIONS,
        {
            "now": now,
            "limit": limit,
            "lease_until": lease_until,
            "me": worker_id,
            **_states(action_states),
        },
    ).all()
    return [Claim(**row._mapping) for row in rows]


def lock_due_gates(
    conn: sa.Connection, gate_states: Sequence[StateKey], *, limit: int, now: datetime.datetime
) -> list[Label]:
    """Lock up to ``limit`` due labels in ``gate_states``, for evaluation in ``conn``.

    Only states this worker's configuration knows are taken, so during a
    rolling deploy an old worker never mistakes a new state for something
    with nothing to do.
    """
    if limit <= 0 or not gate_states:
        return []
    rows = conn.execute(_LOCK_GATES, {"now": now, "limit": limit, **_states(gate_states)}).all()
    return [_label(row) for row in rows]


def lease_gates(
    conn: sa.Connection, labels: Sequence[Label], *, lease_until: datetime.datetime, worker_id: str
) -> list[Claim]:
    """Lease already-locked gate labels whose evaluation must fetch feeds over HTTP."""
    if not labels:
        return []
    rows = conn.execute(
        _LEASE,
        {"lease_until": lease_until, "me": worker_id, **_keys(label.key for label in labels)},
    ).all()
    return [Claim(**row._mapping) for row in rows]


def extend_leases(
    conn: sa.Connection,
    claims: Iterable[Claim],
    *,
    lease_until: datetime.datetime,
    worker_id: str,
) -> None:
    """Keep work that is still in flight from being claimed again by another worker."""
    claims = list(claims)
    if claims:
        names = [claim.name for claim in claims]
        conn.execute(
            _EXTEND_LEASES,
            {
                "lease_until": lease_until,
                "me": worker_id,
                "machines": [claim.state_machine for claim in claims],
                "names": names,
                "keys": label_keys(names),
                "entries": [claim.entry_id for claim in claims],
            },
        )


def record_retry(
    conn: sa.Connection, claim: Claim, *, due_at: datetime.datetime, error: str, worker_id: str
) -> bool:
    """A failed attempt: due again at ``due_at``, unless the label moved or was re-claimed."""
    result = conn.execute(
        _RECORD_RETRY,
        {
            "sm": claim.state_machine,
            "name": claim.name,
            "key": label_key(claim.name),
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
        {
            "sm": claim.state_machine,
            "name": claim.name,
            "key": label_key(claim.name),
            "entry_id": claim.entry_id,
            "error": error,
        },
    )
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

    One set-based statement, so the number of labels costs the database work
    but never worker memory. Labels leased to a worker are being processed
    and are left alone. Paused labels are marked too: the evaluation is owed
    to them when they are resumed.
    """
    params: dict[str, Any] = {"sm": state_machine, "state": state, "now": now}
    if zone_path is None:
        return conn.execute(_MARK_GATE_DUE, params).rowcount
    params.update(path=list(zone_path), zone=zone)
    return conn.execute(_MARK_GATE_DUE_IN_ZONE, params).rowcount


def zones_in_gate(
    conn: sa.Connection, state_machine: str, state: str, path: Sequence[str]
) -> list[str]:
    """The distinct values at metadata ``path`` among labels in the gate."""
    rows = conn.execute(
        _ZONES_IN_GATE, {"sm": state_machine, "state": state, "path": list(path)}
    ).all()
    return [row.zone for row in rows]


def next_due_at(conn: sa.Connection) -> datetime.datetime | None:
    """When the earliest live label falls due (leases expiring included)."""
    result: datetime.datetime | None = conn.execute(_NEXT_DUE).scalar()
    return result


def _states(pairs: Sequence[StateKey]) -> dict[str, list[str]]:
    return {"machines": [machine for machine, _ in pairs], "states": [state for _, state in pairs]}


_IN_STATES = (
    "(state_machine, state) IN (SELECT * FROM unnest(CAST(:machines AS text[]), "
    "CAST(:states AS text[])))"
)
_CLAIMABLE = f"due_at <= :now AND {LIVE} AND {_IN_STATES}"
_CLAIM_COLUMNS = (
    "labels.state_machine, labels.name, labels.state, labels.metadata, labels.entry_id, "
    "labels.attempts"
)

_CLAIM_ACTIONS = sa.text(
    f"""
    WITH due AS (
        SELECT state_machine, name_key FROM labels
        WHERE {_CLAIMABLE}
        ORDER BY due_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE labels SET due_at = :lease_until, lease_owner = :me, attempts = labels.attempts + 1
    FROM due
    WHERE labels.state_machine = due.state_machine AND labels.name_key = due.name_key
    RETURNING {_CLAIM_COLUMNS}
    """
)

_LOCK_GATES = sa.text(
    f"""
    SELECT {_COLUMNS} FROM labels
    WHERE {_CLAIMABLE}
    ORDER BY due_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

_LEASE = sa.text(
    f"""
    UPDATE labels SET due_at = :lease_until, lease_owner = :me, attempts = labels.attempts + 1
    FROM unnest(CAST(:machines AS text[]), CAST(:keys AS bytea[]), CAST(:names AS text[]))
         AS leased(sm, key, name)
    WHERE labels.state_machine = leased.sm AND labels.name_key = leased.key
      AND labels.name = leased.name
    RETURNING {_CLAIM_COLUMNS}
    """
)

_EXTEND_LEASES = sa.text(
    """
    UPDATE labels SET due_at = :lease_until
    FROM unnest(CAST(:machines AS text[]), CAST(:keys AS bytea[]), CAST(:names AS text[]),
                CAST(:entries AS bigint[])) AS held(sm, key, name, entry_id)
    WHERE labels.state_machine = held.sm AND labels.name_key = held.key
      AND labels.name = held.name
      AND labels.entry_id = held.entry_id AND labels.lease_owner = :me
    """
)

_RECORD_RETRY = sa.text(
    """
    UPDATE labels SET due_at = :due_at, last_error = :error, lease_owner = NULL
    WHERE state_machine = :sm AND name_key = :key AND name = :name AND entry_id = :entry_id
      AND lease_owner = :me AND NOT deleted AND NOT errored
    """
)

_RECORD_ERRORED = sa.text(
    """
    UPDATE labels SET errored = true, due_at = NULL, last_error = :error, lease_owner = NULL,
                      updated_at = now()
    WHERE state_machine = :sm AND name_key = :key AND name = :name AND entry_id = :entry_id
      AND NOT deleted
    """
)

_GATE_LABELS = (
    "state_machine = :sm AND state = :state AND NOT deleted AND NOT errored"
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

_NEXT_DUE = sa.text(f"SELECT min(due_at) FROM labels WHERE due_at IS NOT NULL AND {LIVE}")
