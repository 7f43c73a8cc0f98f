"""A label deleted (by the API, a bulk command or retention), and deleted labels removed
with their history (retention's purge)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.catalogue import IN_SHARD, LABELS_IN_SHARD, ONE_LABEL, serialised
from routemaster.db.history import Entry, version_params
from routemaster.db.labels import label_params
from routemaster.db.plumbing.database import distributed
from routemaster.db.shards import shard_map
from routemaster.db.statements import fetch_all, fetch_one, run
from routemaster.db.transitions.entries import append_one

FINISHED_REASON = "retention: finished"
"""The reason of a deletion by retention (:func:`delete_finished`)."""


def soft_delete(
    conn: sa.Connection, state_machine: str, name: str, *, now: datetime.datetime
) -> str | None:
    """Clear the metadata and record the deletion; the state it left, or ``None`` if nothing.

    On Citus two router statements in the caller's transaction (the service's
    :func:`~routemaster.service.transactions.one_label_write`): the
    label's row, locked and marked, then its history row.
    """
    if distributed(conn):
        marked = fetch_one(conn, _MARK_DELETED, {**label_params(state_machine, name), "now": now})
        if marked is None:
            return None
        _, _, state, version = marked
        append_one(
            conn, Entry(state_machine, name, state, None, False, "deleted", version), now=now
        )
        return str(state)
    params = {
        **label_params(state_machine, name),
        **version_params(conn, state_machine),
        "now": now,
    }
    row = fetch_one(conn, _DELETE, params)
    return None if row is None else str(row[0])


def delete_finished(
    conn: sa.Connection,
    state_machine: str,
    end_states: Sequence[str],
    *,
    cutoff: datetime.datetime,
    now: datetime.datetime,
    batch: int,
) -> int:
    """Delete up to ``batch`` labels in an end state since before ``cutoff``: how many.

    Each is deleted as :func:`soft_delete` deletes (its metadata cleared, a history
    entry written, reason :data:`FINISHED_REASON`), so streams and subscriptions see it go.
    Run by retention, in its leader's transaction (:mod:`routemaster.db.retention`).
    """
    params = {
        "sm": state_machine,
        "states": list(end_states),
        "cutoff": cutoff,
        "now": now,
        "batch": batch,
        "reason": FINISHED_REASON,
        "shard_keys": None,
        **version_params(conn, state_machine),
    }
    shards = shard_map(conn)
    if shards is None:
        return run(conn, _DELETE_FINISHED, params)
    done = 0
    found = fetch_all(conn, _FINISHED_KEYS, params)
    for group in shards.whole_shards(conn, [key for (key,) in found]):
        taking = {**params, "batch": batch - done, "shard_keys": group}
        done += shards.run(conn, _DELETE_FINISHED, taking)
        if done >= batch:
            break
    return done


# What every soft delete sets: deleted, metadata cleared, not due, no lease. On Citus the
# label's row alone: a router statement before its history row (soft_delete).
_MARK_DELETED = """
    UPDATE labels SET deleted = true, metadata = '{}'::jsonb, due_at = NULL,
                      lease_owner = NULL, updated_at = %(now)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
    RETURNING state_machine, name, state, version
    """

# On one server, the label's row and its history row in one statement, once the label's
# writers are serialised (routemaster/db/labels.py).
_DELETE = f"""
    WITH deleted AS ({serialised(_MARK_DELETED, ONE_LABEL)})
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, reason,
                         version, xact_id)
    SELECT %(shard_key)s, state_machine, name, state, NULL, %(now)s, 'deleted',
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           routemaster_xact_id()
    FROM deleted
    RETURNING old_state
    """

# Labels in an end state since before the cutoff.
_FINISHED = """state_machine = %(sm)s AND state = ANY (CAST(%(states)s AS text[]))
          AND NOT deleted AND state_entered_at < %(cutoff)s"""

# As _DELETE, for a batch of _FINISHED labels. ``shard_keys``:
# NULL on one server; on Citus every key of one shard, named at each reference to a
# distributed table so that the statement is that shard's (routemaster.db.shards).
_DELETE_FINISHED = f"""
    WITH done AS MATERIALIZED (
        SELECT shard_key, name_key FROM labels
        WHERE {IN_SHARD}
          AND {_FINISHED}
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ),
    marked AS (
        UPDATE labels SET deleted = true, metadata = '{{}}'::jsonb, due_at = NULL,
                          lease_owner = NULL, updated_at = %(now)s
        FROM done
        WHERE {LABELS_IN_SHARD}
          AND labels.shard_key = done.shard_key AND labels.state_machine = %(sm)s
          AND labels.name_key = done.name_key AND NOT labels.deleted
        RETURNING labels.shard_key, labels.state_machine, labels.name, labels.state,
                  labels.version
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, reason,
                         version, xact_id)
    SELECT shard_key, state_machine, name, state, NULL, %(now)s, %(reason)s,
           CASE WHEN %(continuing)s THEN COALESCE(version, %(running)s) ELSE %(running)s END,
           routemaster_xact_id()
    FROM marked
    """

# On Citus: a batch's shard keys (which shards to visit).
_FINISHED_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_FINISHED}
    LIMIT %(batch)s
    """


def purge_deleted(
    conn: sa.Connection, state_machine: str, *, cutoff: datetime.datetime, batch: int
) -> tuple[int, list[str]]:
    """Remove up to ``batch`` labels deleted before ``cutoff``, with their whole history:
    how many labels, and the history positions removed (``xact-id`` texts).

    Run by retention, in its leader's transaction, which records the positions
    (:func:`routemaster.db.retention.remove_deleted`). The name is then free: a POST
    creates it afresh.
    """
    params = {"sm": state_machine, "cutoff": cutoff, "batch": batch, "shard_keys": None}
    shards = shard_map(conn)
    if shards is None:
        row = fetch_one(conn, _REMOVE_DELETED, params)
        assert row is not None  # one row of aggregates
        labels, removed = row
        return int(labels), list(removed or ())
    # Shard by shard (routemaster.db.shards): one row of aggregates from each.
    labels, removed = 0, []
    found = fetch_all(conn, _DELETED_KEYS, params)
    for group in shards.whole_shards(conn, [key for (key,) in found]):
        taking = {**params, "batch": batch - labels, "shard_keys": group}
        [(count, positions)] = shards.fetch_all(conn, _REMOVE_DELETED, taking)
        labels, removed = labels + int(count), removed + list(positions or ())
        if labels >= batch:
            break
    return labels, removed


# Labels deleted before the cutoff, oldest first.
_GONE = """state_machine = %(sm)s AND deleted AND updated_at < %(cutoff)s
        ORDER BY updated_at"""

# Labels deleted before the cutoff (a deleted label is never updated again, so updated_at
# is when it was deleted), oldest first, skipping any the API holds; their rows and their
# whole history go in one statement. ``shard_keys``: NULL on one server; on Citus every key
# of one shard, named at each reference to a distributed table so that the statement is that
# shard's (routemaster.db.shards).
_REMOVE_DELETED = f"""
    WITH gone AS MATERIALIZED (
        SELECT shard_key, name_key FROM labels
        WHERE {IN_SHARD}
          AND {_GONE}
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ),
    labels_removed AS (
        DELETE FROM labels USING gone
        WHERE {LABELS_IN_SHARD}
          AND labels.shard_key = gone.shard_key AND labels.state_machine = %(sm)s
          AND labels.name_key = gone.name_key AND labels.deleted
        RETURNING labels.shard_key, labels.name
    ),
    history_removed AS (
        DELETE FROM history USING labels_removed
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR history.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND history.shard_key = labels_removed.shard_key
          AND history.label = labels_removed.name AND history.state_machine = %(sm)s
        RETURNING history.xact_id, history.id
    )
    SELECT (SELECT count(*) FROM labels_removed),
           (SELECT array_agg(CAST(xact_id AS text) || '-' || id) FROM history_removed)
    """

# On Citus: a batch's shard keys (which shards to visit).
_DELETED_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_GONE}
    LIMIT %(batch)s
    """
