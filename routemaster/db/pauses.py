"""Pauses with an end (``{"until": ...}``): when a paused label resumes by itself.

Statements are written and run as :mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

import datetime
from typing import cast

import sqlalchemy as sa

from routemaster.db.keys import label_key, shard_key
from routemaster.db.labels import Label, label_from_row
from routemaster.db.shards import take
from routemaster.db.statements import fetch_one


def paused_until(conn: sa.Connection, state_machine: str, name: str) -> datetime.datetime | None:
    params = {
        "sm": state_machine,
        "name": name,
        "key": label_key(name),
        "shard_key": shard_key(name),
    }
    row = fetch_one(conn, _PAUSED_UNTIL, params)
    return None if row is None else cast(datetime.datetime | None, row[0])


def lock_ended(conn: sa.Connection, *, now: datetime.datetime, limit: int) -> list[Label]:
    """Lock up to ``limit`` paused labels whose pause has ended."""
    params = {"now": now, "limit": limit, "shard_keys": None}
    rows = take(conn, _ENDED_KEYS, _LOCK_ENDED, params)
    return [label_from_row(row) for row in rows]


# One label is found through the primary key (``name_key``, ``shard_key``) and checked by its
# full name.


_PAUSED_UNTIL = """
    SELECT paused_until FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND paused
    """

# ``shard_keys``: NULL on one server; on Citus every key of one shard (routemaster.db.shards).
_LOCK_ENDED = """
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND paused_until <= %(now)s AND paused AND NOT deleted
    ORDER BY paused_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

# On Citus (routemaster.db.shards): the shard keys of the oldest ended pauses, read without a
# lock across the shards (which shards to visit).
_ENDED_KEYS = """
    SELECT shard_key FROM labels
    WHERE paused_until <= %(now)s AND paused AND NOT deleted
    ORDER BY paused_until
    LIMIT %(limit)s
    """
