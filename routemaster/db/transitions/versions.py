"""A label put on another version of its machine: an upgrade's version, a configuration's
rename of its state."""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster.db.catalogue import IN_SHARD, LABELS_IN_SHARD
from routemaster.db.history import version_params
from routemaster.db.labels import label_params
from routemaster.db.shards import take
from routemaster.db.statements import run


def set_version(
    conn: sa.Connection, machine: str, name: str, version: int, *, now: datetime.datetime
) -> None:
    """Put a (locked) label on ``version``: what it follows from now on."""
    run(conn, _SET_VERSION, {**label_params(machine, name), "v": version, "now": now})


def rename(
    conn: sa.Connection,
    machine: str,
    name: str,
    *,
    old: str,
    new: str,
    version: int,
    reason: str,
    now: datetime.datetime,
) -> None:
    """A (locked) label's state renamed and its version set, with a forced history row.

    As a configuration's rename: the entry is kept (entered time, attempts,
    due time, idempotency token); the history row carries ``version``.
    """
    params = {
        **label_params(machine, name),
        "old": old,
        "new": new,
        "v": version,
        "reason": reason,
        "now": now,
    }
    run(conn, _RENAME_ONE, params)


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

    A configuration's ``migrations:`` rename, one statement per batch: the labels
    change state's name and nothing else (entry, entered time, attempts, due time,
    lease, errored all kept), and each gets a forced history row. Labels locked by
    another transaction, or leased by a worker (a delivery in flight, perhaps by a
    worker running the previous configuration), are skipped: the next pass takes those
    still there. So a webhook in flight is finished by the worker that sent it and never
    sent again. ``version``: only labels that follow it (or keep none): a ``continue``
    machine's older labels keep their states.
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


_SET_VERSION = """
    UPDATE labels SET version = %(v)s, updated_at = %(now)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """

_RENAME_ONE = """
    WITH renamed AS (
        UPDATE labels SET state = %(new)s, version = %(v)s, updated_at = %(now)s
        WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
          AND name = %(name)s AND state = %(old)s
        RETURNING state_machine, name
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    SELECT %(shard_key)s, state_machine, name, %(old)s, %(new)s, %(now)s, true, %(reason)s, %(v)s,
           routemaster_xact_id()
    FROM renamed
    """

# Live labels in the old state, not leased (or whose lease ran out), on the version.
_RENAMED = """state_machine = %(sm)s AND state = %(old)s AND NOT deleted
          AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
          AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL
               OR version = %(version)s)
        ORDER BY name_key"""

# ``shard_keys``: NULL on one server; on Citus every key of one shard, named at each
# reference to labels so that the statement is that shard's (routemaster.db.shards).
_RENAME = f"""
    WITH batch AS (
        SELECT shard_key, state_machine, name_key FROM labels
        WHERE {IN_SHARD}
          AND {_RENAMED}
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), renamed AS (
        UPDATE labels SET state = %(new)s, updated_at = %(now)s
        FROM batch
        WHERE {LABELS_IN_SHARD}
          AND labels.shard_key = batch.shard_key AND labels.state_machine = batch.state_machine
          AND labels.name_key = batch.name_key
        RETURNING labels.shard_key, labels.state_machine, labels.name, labels.version
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    SELECT shard_key, state_machine, name, %(old)s, %(new)s, %(now)s, true, %(reason)s,
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           routemaster_xact_id()
    FROM renamed
    RETURNING id
    """

# On Citus: the shard keys of a batch, read without a lock across the shards (which shards
# to visit).
_RENAME_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_RENAMED}
    LIMIT %(limit)s
    """
