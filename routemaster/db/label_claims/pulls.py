"""Pull tasks claimed: due labels in pull actions leased, one task id each, and run-out
pull leases locked (what is then done by task id is :mod:`routemaster.db.tasks`)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.catalogue import IN_SHARD, LABELS_CLAIMABLE, LABELS_IN_SHARD
from routemaster.db.label_claims.states import IN_STATES, StateKey, state_arrays
from routemaster.db.shards import FIND_KEYS, Fetch, take, take_each
from routemaster.db.tasks import TASKS_ISSUED, Held, LeasedState, Task, claimed_columns


def claim_tasks(
    conn: sa.Connection,
    states: Sequence[LeasedState],
    *,
    ids: Sequence[str],
    worker: str,
    now: datetime.datetime,
) -> list[Task]:
    """Lease up to ``len(ids)`` due labels in pull actions ``states``, oldest due first, one
    id each (on Citus, each shard given the ids the earlier shards left)."""
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
    }

    def claim_in(fetch: Fetch, shard_keys: list[int] | None, taken: list[Task]) -> list[Task]:
        left = list(ids[len(taken) :])
        taking = {**params, "ids": left, "limit": len(left), "shard_keys": shard_keys}
        return [Task(*row) for row in fetch(conn, _CLAIM_TASKS, taking)]

    find = {**params, "find_keys": max(len(ids), FIND_KEYS)}
    return take_each(conn, _AWAITING_KEYS, find, claim_in, wanted=len(ids))


def lock_expired_tasks(
    conn: sa.Connection, states: Sequence[StateKey], *, now: datetime.datetime, limit: int
) -> list[Held]:
    """Lock up to ``limit`` labels in pull actions ``states`` whose lease has run out."""
    if not states:
        return []
    params = {"now": now, "limit": limit, **state_arrays(states)}
    rows = take(conn, _EXPIRED_KEYS, _LOCK_EXPIRED, params, quiet=True)
    return [Held(*row) for row in rows]


# Pull tasks: the pull actions come as arrays (machines, states, their leases in seconds
# and when they end, where each lease came from: recorded in tasks for explanations). Each
# state's oldest due labels come from labels_claimable (so a claim costs the same however
# long the backlog), then the oldest of those are taken; the ids are numbered in that
# order, so each label gets one.
_CLAIM_TASKS = f"""
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
            WHERE {LABELS_IN_SHARD}
              AND labels.state_machine = pulled.state_machine AND labels.state = pulled.state
              AND labels.due_at IS NOT NULL
              -- due_at <= now, written so that only labels_claimable can bound it (labels_due
              -- would walk every due label of every state):
              AND (labels.state, labels.due_at) <= (pulled.state, %(now)s)
              AND labels.lease_owner IS NULL
              AND {LABELS_CLAIMABLE}
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
        WHERE {LABELS_IN_SHARD}
          AND labels.state_machine = numbered.state_machine
          AND labels.name_key = numbered.name_key
        RETURNING {claimed_columns("numbered")}
    ), {TASKS_ISSUED}
    """

# On Citus: the shard keys of the oldest labels awaiting a pull claim (at least FIND_KEYS).
_AWAITING_KEYS = f"""
    SELECT labels.shard_key FROM labels
    WHERE (labels.state_machine, labels.state) IN (
              SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[])))
      AND labels.due_at <= %(now)s AND labels.lease_owner IS NULL
      AND {LABELS_CLAIMABLE}
    ORDER BY labels.due_at
    LIMIT %(find_keys)s
    """

# Run-out pull leases (leased labels, index labels_leased), and on Citus their shard keys.
_EXPIRED = f"""due_at <= %(now)s AND lease_owner IS NOT NULL AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
      AND {IN_STATES}"""

_LOCK_EXPIRED = f"""
    SELECT state_machine, name, state, task_id, attempts, entry_id FROM labels
    WHERE {IN_SHARD}
      AND {_EXPIRED}
    ORDER BY due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

_EXPIRED_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_EXPIRED}
    ORDER BY due_at
    LIMIT %(limit)s
    """
