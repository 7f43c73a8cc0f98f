"""The configuration's ``migrations:`` in the store: the lock that serialises them, and batches.

A rename is one statement per batch: the labels change state's name and
nothing else (entry, entered time, attempts, due time, lease, errored all
kept), and each gets a forced history row. A move is an entry into a new
state, so the label service does it one label at a time
(:func:`names_in_state` finds them).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from routemaster.db.history import version_params
from routemaster.db.lock_rows import exclusive
from routemaster.db.shards import take
from routemaster.db.statements import fetch_all

CONFIG_LEASE = "configuration"
"""The lease row held while versions are recorded and migrations applied
(:mod:`routemaster.db.lock_rows`)."""


@contextmanager
def config_lock(engine: sa.Engine, *, wait: bool) -> Iterator[bool]:
    """Hold the configuration's lease row; whether it is held.

    ``wait=False`` gives up at once when another process holds it.
    """
    with exclusive(engine, name=CONFIG_LEASE, wait=wait) as held:
        yield held


def rename_batch(
    conn: sa.Connection,
    machine: str,
    old: str,
    new: str,
    *,
    reason: str,
    now: datetime.datetime,
    limit: int,
    version: int | None = None,
) -> int:
    """Rename up to ``limit`` live labels from ``old`` to ``new``; how many were renamed.

    Labels locked by another transaction, or leased by a worker (a delivery
    in flight, perhaps by a worker running the previous configuration), are
    skipped: the next pass takes those still there. So a webhook in flight
    is finished by the worker that sent it and never sent again. ``version``: only labels
    that follow it (or keep none): a ``continue`` machine's older labels keep their states.
    """
    params = {
        "sm": machine,
        "old": old,
        "new": new,
        "reason": reason,
        "now": now,
        "limit": limit,
        "version": version,
        "shard_keys": None,
        **version_params(conn, machine),
    }
    return len(take(conn, _RENAME_KEYS, _RENAME, params))


def names_in_state(
    conn: sa.Connection,
    machine: str,
    state: str,
    *,
    now: datetime.datetime,
    limit: int,
    version: int | None = None,
) -> list[str]:
    """Up to ``limit`` live labels in ``state`` that no worker holds a lease on, in index order.

    ``version``: only labels that follow it or keep none (as :func:`rename_batch`).
    """
    rows = fetch_all(
        conn,
        _NAMES_IN_STATE,
        {"sm": machine, "state": state, "now": now, "limit": limit, "version": version},
    )
    return [str(row[0]) for row in rows]


# ``shard_keys``: NULL on one server; on Citus every key of one shard, named at each
# reference to labels so that the statement is that shard's (routemaster.db.shards).
_RENAME = """
    WITH batch AS (
        SELECT shard_key, state_machine, name_key FROM labels
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND state_machine = %(sm)s AND state = %(old)s AND NOT deleted
          AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
          AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL
               OR version = %(version)s)
        ORDER BY name_key
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), renamed AS (
        UPDATE labels SET state = %(new)s, updated_at = %(now)s
        FROM batch
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.shard_key = batch.shard_key AND labels.state_machine = batch.state_machine
          AND labels.name_key = batch.name_key
        RETURNING labels.shard_key, labels.state_machine, labels.name, labels.version
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    SELECT shard_key, state_machine, name, %(old)s, %(new)s, %(now)s, true, %(reason)s,
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           pg_current_xact_id()
    FROM renamed
    RETURNING id
    """

# On Citus: the shard keys of a batch, read without a lock across the shards (which shards
# to visit).
_RENAME_KEYS = """
    SELECT shard_key FROM labels
    WHERE state_machine = %(sm)s AND state = %(old)s AND NOT deleted
      AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
      AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL OR version = %(version)s)
    ORDER BY name_key
    LIMIT %(limit)s
    """

_NAMES_IN_STATE = """
    SELECT name FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted
      AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
      AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL OR version = %(version)s)
    ORDER BY name_key
    LIMIT %(limit)s
    """
