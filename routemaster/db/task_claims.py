"""Pull workers' claims: leasing due labels in pull actions, and finding run-out leases.

A claim leases labels as the worker's claims do (``due_at`` one lease ahead,
``lease_owner`` set, the attempt counted) and gives each lease a new task id
(``labels.task_id``), recorded in ``tasks``; what is then done by task id is
:mod:`routemaster.db.tasks`. Both statements here pick rows with
``FOR UPDATE SKIP LOCKED``; on Citus each runs shard by shard, as
:mod:`routemaster.db.shards` says, beside its plain form.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.shards import shard_map, take
from routemaster.db.statements import Row, fetch_all
from routemaster.db.tasks import Held, LeasedState, Task


def claim(
    conn: sa.Connection,
    states: Sequence[LeasedState],
    *,
    ids: Sequence[str],
    worker: str,
    now: datetime.datetime,
) -> list[Task]:
    """Lease up to ``len(ids)`` due labels in ``states``, oldest due first, one id each."""
    if not states or not ids:
        return []
    params = {
        "machines": [machine for machine, _, _ in states],
        "states": [state for _, state, _ in states],
        "leases": [lease.seconds for _, _, lease in states],
        # Computed here: Citus refuses a STABLE function (timestamptz + interval) of a
        # column in an UPDATE.
        "lease_untils": [now + datetime.timedelta(seconds=lease.seconds) for _, _, lease in states],
        "sources": [lease.source for _, _, lease in states],
        "samples": [lease.samples for _, _, lease in states],
        "ids": list(ids),
        "limit": len(ids),
        "worker": worker,
        "now": now,
        "shard_keys": None,
    }
    shards = shard_map(conn)
    if shards is None:
        return [Task(*row) for row in fetch_all(conn, _CLAIM, params)]
    rows: list[Row] = []
    for group in shards.shards_with_work(conn, _AWAITING_KEYS, params):
        left = list(ids[len(rows) :])
        taking = {**params, "ids": left, "limit": len(left), "shard_keys": group}
        taken = shards.fetch_all(conn, _CLAIM, taking)
        shards.answered(_AWAITING_KEYS, group, full=len(taken) >= len(left))
        rows += taken
        if len(rows) >= len(ids):
            break
    return [Task(*row) for row in rows]


def lock_expired(
    conn: sa.Connection, states: Sequence[tuple[str, str]], *, now: datetime.datetime, limit: int
) -> list[Held]:
    """Lock up to ``limit`` labels in ``states`` whose lease has run out."""
    if not states:
        return []
    params = {
        "machines": [machine for machine, _ in states],
        "states": [state for _, state in states],
        "now": now,
        "limit": limit,
    }
    rows = take(conn, _EXPIRED_KEYS, _LOCK_EXPIRED, params)
    return [Held(*row) for row in rows]


# The pull actions a claim takes from come as arrays: machines, states, their leases in
# seconds and when they end, and where each lease came from (recorded in tasks for
# explanations). Each state's oldest due labels come from the labels_claimable index
# (so a claim costs the same however long the backlog; it holds only labels that can be
# claimed, migration 0019), then the oldest of those are taken; the ids are numbered in
# that order, so each label gets one. ``shard_keys``: NULL on one server; on Citus every
# key of one shard, named at each reference to labels so that the whole statement is that
# shard's (routemaster.db.shards).
_CLAIM = """
    WITH pulled AS (
        SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[]),
                             CAST(%(leases)s AS double precision[]),
                             CAST(%(sources)s AS text[]), CAST(%(samples)s AS integer[]),
                             CAST(%(lease_untils)s AS timestamptz[]))
                      AS p(state_machine, state, lease, lease_source, lease_samples, lease_until)
    ), candidates AS (
        SELECT waiting.*, pulled.lease, pulled.lease_source, pulled.lease_samples,
               pulled.lease_until
        FROM pulled CROSS JOIN LATERAL (
            SELECT labels.state_machine, labels.name_key, labels.due_at FROM labels
            WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
                   OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
              AND labels.state_machine = pulled.state_machine AND labels.state = pulled.state
              AND labels.due_at IS NOT NULL
              -- due_at <= now, written so that only labels_claimable can bound it (labels_due
              -- would walk every due label of every state):
              AND (labels.state, labels.due_at) <= (pulled.state, %(now)s)
              AND labels.lease_owner IS NULL
              AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
            ORDER BY labels.due_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS waiting
    ), due AS (
        SELECT * FROM candidates ORDER BY due_at LIMIT %(limit)s
    ), numbered AS (
        SELECT due.*, row_number() OVER (ORDER BY due.due_at) AS n FROM due
    ), ids AS (
        SELECT * FROM unnest(CAST(%(ids)s AS text[])) WITH ORDINALITY AS i(id, n)
    ), claimed AS (
        UPDATE labels SET due_at = numbered.lease_until,
                          lease_owner = %(worker)s,
                          task_id = CAST(labels.shard_key AS text) || '.' || ids.id,
                          attempts = labels.attempts + 1
        FROM numbered JOIN ids ON ids.n = numbered.n
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.state_machine = numbered.state_machine
          AND labels.name_key = numbered.name_key
        RETURNING labels.task_id, labels.state_machine, labels.name, labels.state,
                  labels.metadata, labels.attempts, labels.entry_id, labels.due_at,
                  numbered.lease, numbered.lease_source, numbered.lease_samples, numbered.n,
                  labels.shard_key
    ), issued AS (
        INSERT INTO tasks (id, shard_key, state_machine, label, state, entry_id, attempt, worker,
                           lease, claimed_at, lease_source, lease_samples)
        SELECT task_id, shard_key, state_machine, name, state, entry_id, attempts, %(worker)s,
               lease * interval '1 second', %(now)s, lease_source, lease_samples
        FROM claimed
    )
    SELECT task_id AS id, state_machine, name AS label, state, metadata, attempts AS attempt,
           entry_id, due_at AS lease_expires_at
    FROM claimed ORDER BY n
    """

# On Citus: the shard keys of the oldest labels awaiting a claim, read without a lock across
# the shards (which shards to visit).
_AWAITING_KEYS = """
    SELECT labels.shard_key FROM labels
    WHERE (labels.state_machine, labels.state) IN (
              SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[])))
      AND labels.due_at <= %(now)s AND labels.lease_owner IS NULL
      AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
    ORDER BY labels.due_at
    LIMIT %(limit)s
    """

_LOCK_EXPIRED = """
    SELECT state_machine, name, state, task_id, attempts, entry_id FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND due_at <= %(now)s AND lease_owner IS NOT NULL AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

# On Citus: the shard keys of the oldest run-out leases, read without a lock across the
# shards (which shards to visit).
_EXPIRED_KEYS = """
    SELECT shard_key FROM labels
    WHERE due_at <= %(now)s AND lease_owner IS NOT NULL AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    """
