"""Pull workers' tasks: claiming labels in pull actions, and acting on them by task id.

A claim leases labels as the worker's claims do (``due_at`` one lease ahead,
``lease_owner`` set, the attempt counted) and gives each lease a new task id
(``labels.task_id``), recorded in ``tasks``. Every call made with a task id
acts in one statement that also checks the lease: ``task_id = :id``, still
leased (every move and operator command clears ``lease_owner``) and not run
out (``due_at > :now``). A stale id therefore changes nothing, whatever the
order in which two workers call.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.keys import label_keys
from routemaster.db.labels import _LABELS_COLUMNS, Label, _label

PullState = tuple[str, str, float]
"""(state machine, state, lease in seconds)."""


@dataclass(frozen=True)
class Task:
    """One claimed label, as ``POST /tasks/claim`` shows it."""

    id: str
    state_machine: str
    label: str
    state: str
    metadata: dict[str, Any]
    attempt: int
    entry_id: int  # the idempotency token a webhook of the same entry would carry
    lease_expires_at: datetime.datetime


@dataclass(frozen=True)
class Held:
    """A label whose lease has run out: to be retried later or errored."""

    state_machine: str
    name: str
    state: str
    task_id: str
    attempts: int


@dataclass(frozen=True)
class Expiry:
    """What becomes of one run-out lease: due again at ``due_at``, or errored (``None``)."""

    held: Held
    due_at: datetime.datetime | None


def claim(
    conn: sa.Connection,
    states: Sequence[PullState],
    *,
    ids: Sequence[str],
    worker: str,
    now: datetime.datetime,
) -> list[Task]:
    """Lease up to ``len(ids)`` due labels in ``states``, oldest due first, one id each."""
    if not states or not ids:
        return []
    rows = conn.execute(
        _CLAIM,
        {
            "machines": [machine for machine, _, _ in states],
            "states": [state for _, state, _ in states],
            "leases": [lease for _, _, lease in states],
            "ids": list(ids),
            "limit": len(ids),
            "worker": worker,
            "now": now,
        },
    ).all()
    return [Task(**row._mapping) for row in rows]


def lock_expired(
    conn: sa.Connection, states: Sequence[tuple[str, str]], *, now: datetime.datetime, limit: int
) -> list[Held]:
    """Lock up to ``limit`` labels in ``states`` whose lease has run out."""
    if not states:
        return []
    rows = conn.execute(
        _LOCK_EXPIRED,
        {
            "machines": [machine for machine, _ in states],
            "states": [state for _, state in states],
            "now": now,
            "limit": limit,
        },
    ).all()
    return [Held(**row._mapping) for row in rows]


def expire(
    conn: sa.Connection, expiries: Sequence[Expiry], *, error: str, now: datetime.datetime
) -> None:
    """End locked run-out leases: each due again at its time, or errored."""
    if not expiries:
        return
    names = [expiry.held.name for expiry in expiries]
    conn.execute(
        _EXPIRE,
        {
            "machines": [expiry.held.state_machine for expiry in expiries],
            "names": names,
            "keys": label_keys(names),
            "ids": [expiry.held.task_id for expiry in expiries],
            "due": [expiry.due_at for expiry in expiries],
            "error": error,
            "now": now,
        },
    )


def heartbeat(
    conn: sa.Connection, task_id: str, *, now: datetime.datetime
) -> datetime.datetime | None:
    """Extend the lease by its length from now; ``None`` when the id holds no live lease."""
    expires: datetime.datetime | None = conn.execute(
        _HEARTBEAT, {"id": task_id, "now": now}
    ).scalar()
    return expires


def take(
    conn: sa.Connection, task_id: str, *, outcome: str, now: datetime.datetime
) -> tuple[Label, int] | None:
    """End the live lease ``task_id`` and lock its label; ``None`` when it holds none.

    Returns the label (its lease ended, still in the action, not due: the
    caller moves it on or says when it is due again) and the task's attempt number.
    """
    row = conn.execute(_TAKE, {"id": task_id, "outcome": outcome, "now": now}).one_or_none()
    if row is None:
        return None
    values = dict(row._mapping)
    attempt = values.pop("task_attempt")
    return Label(**values), attempt


def issued(conn: sa.Connection, task_id: str) -> bool:
    """Whether ``task_id`` was ever issued."""
    return conn.execute(_ISSUED, {"id": task_id}).first() is not None


def set_due(
    conn: sa.Connection,
    label: Label,
    *,
    due_at: datetime.datetime | None,
    errored: bool = False,
    error: str | None = None,
    attempts: int | None = None,
) -> Label:
    """After ``take``: when the label is next due, or errored, and its attempt count."""
    row = conn.execute(
        _SET_DUE,
        {
            "sm": label.state_machine,
            "name": label.name,
            "key": label_keys([label.name])[0],
            "due_at": due_at,
            "errored": errored,
            "error": error,
            "attempts": label.attempts if attempts is None else attempts,
        },
    ).one()
    return _label(row)


def open_callback(
    conn: sa.Connection,
    key: tuple[str, str],
    *,
    entry_id: int,
    task_id: str,
    holder: str,
    lease_seconds: float,
    now: datetime.datetime,
) -> bool:
    """Give a label a webhook worker holds a task id, before its webhook is sent (202 callbacks).

    Whether the label was still held by ``holder`` in entry ``entry_id``.
    """
    result = conn.execute(
        _OPEN_CALLBACK,
        {
            "sm": key[0],
            "name": key[1],
            "key": label_keys([key[1]])[0],
            "entry_id": entry_id,
            "id": task_id,
            "holder": holder,
            "lease": lease_seconds,
            "now": now,
        },
    )
    return result.rowcount == 1


def hold_for_callback(conn: sa.Connection, task_id: str, *, until: datetime.datetime) -> bool:
    """After a 202: keep the label leased until ``until`` for the receiver to finish the task."""
    return conn.execute(_HOLD_FOR_CALLBACK, {"id": task_id, "until": until}).rowcount == 1


_PULLED = """
    SELECT * FROM unnest(CAST(:machines AS text[]), CAST(:states AS text[]),
                         CAST(:leases AS double precision[])) AS p(state_machine, state, lease)
"""

# Each state's oldest due labels come from the labels_awaiting_claim index (so a
# claim costs the same however long the backlog), then the oldest of those are
# taken; the ids are numbered in that order, so each label gets one.
_CLAIM = sa.text(
    f"""
    WITH pulled AS ({_PULLED}), candidates AS (
        SELECT waiting.*, pulled.lease
        FROM pulled CROSS JOIN LATERAL (
            SELECT labels.state_machine, labels.name_key, labels.due_at FROM labels
            WHERE labels.state_machine = pulled.state_machine AND labels.state = pulled.state
              AND labels.due_at <= :now AND labels.lease_owner IS NULL
              AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
            ORDER BY labels.due_at
            LIMIT :limit
            FOR UPDATE SKIP LOCKED
        ) AS waiting
    ), due AS (
        SELECT * FROM candidates ORDER BY due_at LIMIT :limit
    ), numbered AS (
        SELECT due.*, row_number() OVER (ORDER BY due.due_at) AS n FROM due
    ), ids AS (
        SELECT * FROM unnest(CAST(:ids AS text[])) WITH ORDINALITY AS i(id, n)
    ), claimed AS (
        UPDATE labels SET due_at = :now + numbered.lease * interval '1 second',
                          lease_owner = :worker, task_id = ids.id,
                          attempts = labels.attempts + 1
        FROM numbered JOIN ids ON ids.n = numbered.n
        WHERE labels.state_machine = numbered.state_machine
          AND labels.name_key = numbered.name_key
        RETURNING labels.task_id, labels.state_machine, labels.name, labels.state,
                  labels.metadata, labels.attempts, labels.entry_id, labels.due_at,
                  numbered.lease, numbered.n
    ), issued AS (
        INSERT INTO tasks (id, state_machine, label, state, entry_id, attempt, worker, lease,
                           claimed_at)
        SELECT task_id, state_machine, name, state, entry_id, attempts, :worker,
               lease * interval '1 second', :now
        FROM claimed
    )
    SELECT task_id AS id, state_machine, name AS label, state, metadata, attempts AS attempt,
           entry_id, due_at AS lease_expires_at
    FROM claimed ORDER BY n
    """
)

_LOCK_EXPIRED = sa.text(
    """
    SELECT state_machine, name, state, task_id, attempts FROM labels
    WHERE due_at <= :now AND lease_owner IS NOT NULL AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(:machines AS text[]),
                                                          CAST(:states AS text[])))
    ORDER BY due_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

_EXPIRE = sa.text(
    """
    WITH expired AS (
        SELECT * FROM unnest(CAST(:machines AS text[]), CAST(:keys AS bytea[]),
                             CAST(:names AS text[]), CAST(:ids AS text[]),
                             CAST(:due AS timestamptz[])) AS e(sm, key, name, id, due_at)
    ), ended AS (
        UPDATE tasks SET ended_at = :now, outcome = 'expired'
        FROM expired WHERE tasks.id = expired.id
    )
    UPDATE labels SET due_at = expired.due_at, errored = expired.due_at IS NULL,
                      last_error = :error, lease_owner = NULL, task_id = NULL,
                      updated_at = now()
    FROM expired
    WHERE labels.state_machine = expired.sm AND labels.name_key = expired.key
      AND labels.name = expired.name AND labels.task_id = expired.id
    """
)

_LIVE_LEASE = (
    "labels.task_id = :id AND labels.lease_owner IS NOT NULL AND labels.due_at > :now"
    " AND NOT labels.deleted AND NOT labels.errored"
)

_HEARTBEAT = sa.text(
    f"""
    UPDATE labels SET due_at = :now + tasks.lease
    FROM tasks
    WHERE tasks.id = :id AND {_LIVE_LEASE}
    RETURNING labels.due_at
    """
)

_TAKE = sa.text(
    f"""
    WITH taken AS (
        UPDATE labels SET lease_owner = NULL, task_id = NULL, due_at = NULL, updated_at = now()
        WHERE {_LIVE_LEASE}
        RETURNING {_LABELS_COLUMNS}
    ), ended AS (
        UPDATE tasks SET ended_at = :now, outcome = :outcome
        FROM taken WHERE tasks.id = :id
        RETURNING tasks.attempt
    )
    SELECT taken.*, ended.attempt AS task_attempt FROM taken, ended
    """
)

_ISSUED = sa.text("SELECT 1 FROM tasks WHERE id = :id")

_SET_DUE = sa.text(
    f"""
    UPDATE labels SET due_at = :due_at, errored = :errored, last_error = :error,
                      attempts = :attempts, updated_at = now()
    WHERE state_machine = :sm AND name_key = :key AND name = :name
    RETURNING {_LABELS_COLUMNS}
    """
)

_OPEN_CALLBACK = sa.text(
    """
    WITH opened AS (
        UPDATE labels SET task_id = :id
        WHERE state_machine = :sm AND name_key = :key AND name = :name
          AND entry_id = :entry_id AND lease_owner = :holder AND NOT deleted AND NOT errored
        RETURNING state_machine, name, state, entry_id, attempts
    )
    INSERT INTO tasks (id, state_machine, label, state, entry_id, attempt, worker, lease,
                       claimed_at)
    SELECT :id, state_machine, name, state, entry_id, attempts, :holder,
           :lease * interval '1 second', :now
    FROM opened
    """
)

_HOLD_FOR_CALLBACK = sa.text(
    """
    UPDATE labels SET due_at = :until
    WHERE task_id = :id AND lease_owner IS NOT NULL AND NOT deleted AND NOT errored
    """
)
