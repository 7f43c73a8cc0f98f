"""Child labels (SPEC G3): who spawned them, how far spawning got, their counts and wake-ups.

Three tables (migration 0021). ``children`` sits beside each child (its
``shard_key``) and says whose child it is; ``spawns`` sits beside each
parent and records how many children it has and how many are spawned, in
the transaction that creates them; ``child_wakes`` is where a finishing
child leaves word for its parent, in the child's own transaction and on
the child's own shard, so that the child never writes its parent's row.

A child's outcome is read from its own label row, never copied: the
parent counts its children by joining ``children`` with ``labels`` (the
same shard key on both sides, so on Citus each shard joins its own rows),
which makes the counts exactly what the children's committed states say.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.labels import LabelKey
from routemaster.db.notifications import notify_due
from routemaster.db.shards import take
from routemaster.db.statements import fetch_all, fetch_one, run

StateKey = tuple[str, str]
"""(machine, state)."""


@dataclass(frozen=True)
class SpawnProgress:
    """A parent's ``spawns`` row: the entry it spawns for, its children, how many exist."""

    state: str  # the spawn state
    entry_id: int
    total: int
    spawned: int
    depth: int  # how many spawns deep its children are (1: the parent is no child)


@dataclass(frozen=True)
class NewChild:
    """One child to create: its name, position in the parent's list, metadata and timing."""

    name: str
    position: int
    metadata: dict[str, Any]
    due_at: datetime.datetime | None
    next_check_at: datetime.datetime | None


@dataclass(frozen=True)
class ChildRow:
    """A child as ``GET .../children`` lists it."""

    state_machine: str
    name: str
    state: str
    deleted: bool
    metadata: dict[str, Any]
    position: int


def _parent_params(parent: LabelKey) -> dict[str, Any]:
    machine, name = parent
    return {
        "parent_sm": machine,
        "parent_name": name,
        "parent_key": label_key(name),
        "parent_shard_key": shard_key(name),
    }


# --- progress -------------------------------------------------------------------------------


def progress(conn: sa.Connection, parent: LabelKey) -> SpawnProgress | None:
    row = fetch_one(conn, _PROGRESS, _parent_params(parent))
    return None if row is None else SpawnProgress(*row)


def start(
    conn: sa.Connection, parent: LabelKey, *, state: str, entry_id: int, total: int, depth: int
) -> SpawnProgress:
    """The parent's progress for entry ``entry_id`` of ``state``, nothing spawned yet
    (replacing an older entry's)."""
    params = {
        **_parent_params(parent),
        "state": state,
        "entry_id": entry_id,
        "total": total,
        "depth": depth,
    }
    run(conn, _START, params)
    return SpawnProgress(state, entry_id, total, 0, depth)


def depth_of(conn: sa.Connection, label: LabelKey) -> int:
    """How many spawns deep ``label`` is: 0 for a label no spawn created."""
    row = fetch_one(conn, _DEPTH, _parent_params(label))
    return 0 if row is None else int(row[0])


_PROGRESS = """
    SELECT state, entry_id, total, spawned, depth FROM spawns
    WHERE state_machine = %(parent_sm)s AND name_key = %(parent_key)s
      AND shard_key = %(parent_shard_key)s
    """

_START = """
    INSERT INTO spawns (shard_key, state_machine, name_key, state, entry_id, total, spawned,
                        depth)
    VALUES (%(parent_shard_key)s, %(parent_sm)s, %(parent_key)s, %(state)s, %(entry_id)s,
            %(total)s, 0, %(depth)s)
    ON CONFLICT (state_machine, name_key, shard_key) DO UPDATE
        SET state = excluded.state, entry_id = excluded.entry_id, total = excluded.total,
            spawned = 0, depth = excluded.depth
    """

_DEPTH = """
    SELECT depth FROM children
    WHERE state_machine = %(parent_sm)s AND name_key = %(parent_key)s
      AND shard_key = %(parent_shard_key)s
    """


# --- spawning -------------------------------------------------------------------------------


def record_spawned(conn: sa.Connection, parent: LabelKey, *, spawned: int) -> None:
    """How many children exist now, in the transaction that created the last of them."""
    run(conn, _RECORD_SPAWNED, {**_parent_params(parent), "spawned": spawned})


_RECORD_SPAWNED = """
    UPDATE spawns SET spawned = %(spawned)s
    WHERE state_machine = %(parent_sm)s AND name_key = %(parent_key)s
      AND shard_key = %(parent_shard_key)s
    """


def child_rows(
    parent: LabelKey, machine: str, children: Sequence[NewChild], depth: int
) -> dict[str, Any]:
    """The arrays the statement creating ``children`` unnests
    (:func:`routemaster.db.transitions.create_children`)."""
    names = [child.name for child in children]
    return {
        **_parent_params(parent),
        "sm": machine,
        "depth": depth,
        "names": names,
        "keys": [label_key(name) for name in names],
        "shard_keys": [shard_key(name) for name in names],
        "metadata": [json.dumps(child.metadata) for child in children],
        "positions": [child.position for child in children],
        "due_ats": [child.due_at for child in children],
        "next_check_ats": [child.next_check_at for child in children],
    }


# --- counting -------------------------------------------------------------------------------


def states_of_children(
    conn: sa.Connection, parent: LabelKey, machine: str
) -> list[tuple[str, bool, int]]:
    """How many of the parent's children of ``machine`` are in each (state, deleted)."""
    rows = fetch_all(conn, _COUNT, {**_parent_params(parent), "sm": machine})
    return [(str(state), bool(deleted), int(count)) for state, deleted, count in rows]


_COUNT = """
    SELECT labels.state, labels.deleted, count(*)
    FROM children
    JOIN labels ON labels.state_machine = children.state_machine
               AND labels.name_key = children.name_key
               AND labels.shard_key = children.shard_key
    WHERE children.parent_machine = %(parent_sm)s AND children.parent_key = %(parent_key)s
      AND children.state_machine = %(sm)s
    GROUP BY labels.state, labels.deleted
    """


def page(
    conn: sa.Connection,
    parent: LabelKey,
    machine: str,
    *,
    after: int,
    limit: int,
    outcome: str | None,
    succeeded: Sequence[str],
    failed: Sequence[str],
) -> list[ChildRow]:
    """The parent's children after position ``after``, in order, ``outcome`` ones only
    (``running``: neither), given the child machine's ``succeeded`` and ``failed`` states."""
    rows = fetch_all(
        conn,
        _PAGE,
        {
            **_parent_params(parent),
            "sm": machine,
            "after": after,
            "limit": limit,
            "outcome": outcome,
            "succeeded": list(succeeded),
            "failed": list(failed),
        },
    )
    return [ChildRow(*row) for row in rows]


_PAGE = """
    SELECT labels.state_machine, labels.name, labels.state, labels.deleted, labels.metadata,
           children.position
    FROM children
    JOIN labels ON labels.state_machine = children.state_machine
               AND labels.name_key = children.name_key
               AND labels.shard_key = children.shard_key
    WHERE children.parent_machine = %(parent_sm)s AND children.parent_key = %(parent_key)s
      AND children.state_machine = %(sm)s AND children.position > %(after)s
      AND (CAST(%(outcome)s AS text) IS NULL
           OR (%(outcome)s = 'succeeded' AND NOT labels.deleted
               AND labels.state = ANY(CAST(%(succeeded)s AS text[])))
           OR (%(outcome)s = 'failed'
               AND (labels.deleted OR labels.state = ANY(CAST(%(failed)s AS text[]))))
           OR (%(outcome)s = 'running' AND NOT labels.deleted
               AND NOT labels.state = ANY(CAST(%(succeeded)s AS text[]))
               AND NOT labels.state = ANY(CAST(%(failed)s AS text[]))))
    ORDER BY children.position
    LIMIT %(limit)s
    """


def running(
    conn: sa.Connection, parent: LabelKey, machine: str, finished: Sequence[str], *, limit: int
) -> list[str]:
    """Names of up to ``limit`` of the parent's children of ``machine`` still running: not
    deleted, in none of the ``finished`` states."""
    rows = fetch_all(
        conn,
        _RUNNING,
        {**_parent_params(parent), "sm": machine, "finished": list(finished), "limit": limit},
    )
    return [str(row[0]) for row in rows]


_RUNNING = """
    SELECT labels.name
    FROM children
    JOIN labels ON labels.state_machine = children.state_machine
               AND labels.name_key = children.name_key
               AND labels.shard_key = children.shard_key
    WHERE children.parent_machine = %(parent_sm)s AND children.parent_key = %(parent_key)s
      AND children.state_machine = %(sm)s AND NOT labels.deleted
      AND NOT labels.state = ANY(CAST(%(finished)s AS text[]))
    ORDER BY children.position
    LIMIT %(limit)s
    """


def parent_of(conn: sa.Connection, child: LabelKey) -> LabelKey | None:
    """The label that spawned ``child``, if a spawn did."""
    row = fetch_one(conn, _PARENT, _parent_params(child))
    return None if row is None else (str(row[0]), str(row[1]))


_PARENT = """
    SELECT parent_machine, parent_name FROM children
    WHERE state_machine = %(parent_sm)s AND name_key = %(parent_key)s
      AND shard_key = %(parent_shard_key)s
    """


# --- waking parents -------------------------------------------------------------------------


def leave_word(conn: sa.Connection, finished: Iterable[LabelKey]) -> None:
    """Children that finished in ``conn``'s transaction: word for their parents, beside each
    child (a label no spawn created leaves none), and a ``NOTIFY`` for the workers."""
    arrays = label_key_arrays(finished)
    if not arrays["names"] or not run(conn, _LEAVE_WORD, arrays):
        return
    notify_due(conn)


_LEAVE_WORD = """
    INSERT INTO child_wakes (shard_key, parent_machine, parent_name, parent_key,
                             parent_shard_key)
    SELECT children.shard_key, children.parent_machine, children.parent_name,
           children.parent_key, children.parent_shard_key
    FROM children
    WHERE (children.state_machine, children.name_key, children.shard_key) IN (
        SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(keys)s AS bytea[]),
                             CAST(%(shard_keys)s AS integer[])))
    ON CONFLICT DO NOTHING
    """


def wake_parents(
    conn: sa.Connection, spawn_states: Sequence[StateKey], *, limit: int, now: datetime.datetime
) -> int:
    """Take up to ``limit`` words children left, and make their parents waiting in a spawn
    state due now (in this transaction: a crash leaves the words for the next round)."""
    if not spawn_states or limit <= 0:
        return 0
    rows = take(conn, _WAKES_FOUND, _TAKE_WAKES, {"limit": limit})
    parents = sorted({(str(row[0]), str(row[1])) for row in rows})
    if parents and run(
        conn,
        _WAKE,
        {
            **label_key_arrays(parents),
            "now": now,
            "spawn_machines": [machine for machine, _ in spawn_states],
            "spawn_states": [state for _, state in spawn_states],
        },
    ):
        notify_due(conn)
    return len(rows)


_WAKES_FOUND = """
    SELECT shard_key FROM child_wakes ORDER BY created_at LIMIT %(limit)s
    """

_TAKE_WAKES = """
    DELETE FROM child_wakes
    WHERE (parent_machine, parent_key, parent_shard_key, shard_key) IN (
        SELECT parent_machine, parent_key, parent_shard_key, shard_key FROM child_wakes
        WHERE CAST(%(shard_keys)s AS integer[]) IS NULL
              OR shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
        ORDER BY created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
    RETURNING parent_machine, parent_name
    """

_WAKE = """
    UPDATE labels SET due_at = %(now)s
    WHERE (state_machine, name_key, shard_key) IN (
            SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(keys)s AS bytea[]),
                                 CAST(%(shard_keys)s AS integer[])))
      AND (state_machine, state) IN (
            SELECT * FROM unnest(CAST(%(spawn_machines)s AS text[]),
                                 CAST(%(spawn_states)s AS text[])))
      AND NOT deleted AND (due_at IS NULL OR due_at > %(now)s)
    """


def recheck_at(
    conn: sa.Connection, parent: LabelKey, *, entry_id: int, due_at: datetime.datetime | None
) -> None:
    """When a parent still waiting is looked at again if no child's word comes first."""
    run(conn, _RECHECK, {**_parent_params(parent), "entry_id": entry_id, "due_at": due_at})


_RECHECK = """
    UPDATE labels SET due_at = %(due_at)s
    WHERE state_machine = %(parent_sm)s AND name_key = %(parent_key)s
      AND shard_key = %(parent_shard_key)s AND entry_id = %(entry_id)s
    """


# --- parents that left ----------------------------------------------------------------------


def left(conn: sa.Connection, *, limit: int) -> list[tuple[LabelKey, str, int]]:
    """Parents whose ``spawns`` row outlived their stay in the spawn state (moved on, by
    their ``next`` or an operator, or deleted): (parent, the spawn state, its entry)."""
    rows = fetch_all(conn, _LEFT, {"limit": limit})
    return [((str(sm), str(name)), str(state), int(entry)) for sm, name, state, entry in rows]


_LEFT = """
    SELECT labels.state_machine, labels.name, spawns.state, spawns.entry_id
    FROM spawns
    JOIN labels ON labels.state_machine = spawns.state_machine
               AND labels.name_key = spawns.name_key
               AND labels.shard_key = spawns.shard_key
    WHERE labels.deleted OR labels.entry_id <> spawns.entry_id
    LIMIT %(limit)s
    """


def forget(conn: sa.Connection, parent: LabelKey, *, entry_id: int) -> None:
    """The parent is done with entry ``entry_id``'s children: its progress row goes."""
    run(conn, _FORGET, {**_parent_params(parent), "entry_id": entry_id})


_FORGET = """
    DELETE FROM spawns
    WHERE state_machine = %(parent_sm)s AND name_key = %(parent_key)s
      AND shard_key = %(parent_shard_key)s AND entry_id = %(entry_id)s
    """
