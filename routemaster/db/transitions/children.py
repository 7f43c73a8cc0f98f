"""Creating a spawn's children (SPEC G3): many labels, their first history rows and their
``children`` rows, in one statement.

A batch of a parent's children, each named ``PARENT/INDEX``, created in the child
machine's first state with its first history entry (as :func:`.creation.insert` writes
one) and the row that says whose child it is (:mod:`routemaster.db.children`). A name
already taken is skipped (``ON CONFLICT DO NOTHING``): a batch a killed worker committed
is never created twice, and its progress (``spawns.spawned``) is recorded in the same
transaction by the caller.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.children import NewChild, child_rows
from routemaster.db.labels import LabelKey
from routemaster.db.notifications import notify_due
from routemaster.db.statements import fetch_all


def create_children(
    conn: sa.Connection,
    parent: LabelKey,
    machine: str,
    children: Sequence[NewChild],
    *,
    state: str,
    depth: int,
    version: int | None,
    history_version: int | None,
    now: datetime.datetime,
) -> int:
    """Create ``children`` of ``parent`` in ``machine``'s ``state``, each with its first
    history entry and its ``children`` row, in one statement; how many were created (a name
    taken already, by an earlier run of the same batch or otherwise, is left as it is). A
    ``children`` row left by a label since purged (retention) is taken over."""
    if not children:
        return 0
    params = {
        **child_rows(parent, machine, children, depth),
        "state": state,
        "now": now,
        "version": version,
        "history_version": history_version,
    }
    created = len(fetch_all(conn, _CREATE, params))
    if any(child.due_at is not None and child.due_at <= now for child in children):
        notify_due(conn)
    return created


_CREATE = """
    WITH items AS (
        SELECT * FROM unnest(CAST(%(names)s AS text[]), CAST(%(keys)s AS bytea[]),
                             CAST(%(shard_keys)s AS integer[]), CAST(%(metadata)s AS jsonb[]),
                             CAST(%(positions)s AS integer[]),
                             CAST(%(due_ats)s AS timestamp with time zone[]),
                             CAST(%(next_check_ats)s AS timestamp with time zone[]))
            AS item (name, name_key, shard_key, metadata, position, due_at, next_check_at)
    ), created AS (
        INSERT INTO labels (shard_key, state_machine, name, name_key, metadata, state,
                            state_entered_at, entry_id, due_at, next_check_at, created_at,
                            updated_at, scheduled_at, version)
        SELECT shard_key, %(sm)s, name, name_key, metadata, %(state)s, %(now)s,
               nextval(pg_get_serial_sequence('history', 'id')), due_at, next_check_at,
               %(now)s, %(now)s, %(now)s, %(version)s
        FROM items
        ON CONFLICT (state_machine, name_key, shard_key) DO NOTHING
        RETURNING shard_key, name, name_key, entry_id
    ), entries AS (
        INSERT INTO history (id, shard_key, state_machine, label, old_state, new_state, created,
                             version, xact_id)
        SELECT entry_id, shard_key, %(sm)s, name, NULL, %(state)s, %(now)s,
               %(history_version)s, routemaster_xact_id()
        FROM created
    )
    INSERT INTO children (shard_key, state_machine, name, name_key, parent_machine,
                          parent_name, parent_key, parent_shard_key, position, depth)
    SELECT created.shard_key, %(sm)s, created.name, created.name_key, %(parent_sm)s,
           %(parent_name)s, %(parent_key)s, %(parent_shard_key)s, items.position, %(depth)s
    FROM created
    JOIN items ON items.name_key = created.name_key AND items.shard_key = created.shard_key
    ON CONFLICT (state_machine, name_key, shard_key) DO UPDATE
        SET parent_machine = excluded.parent_machine, parent_name = excluded.parent_name,
            parent_key = excluded.parent_key, parent_shard_key = excluded.parent_shard_key,
            position = excluded.position, depth = excluded.depth, outcome = NULL,
            created_at = excluded.created_at
    RETURNING shard_key
    """
