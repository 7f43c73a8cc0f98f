"""Child labels (SPEC G3): who spawned them, how far spawning got, their counts and wake-ups.

Three tables (migration 0021). ``children`` sits beside each child (its
``shard_key``) and says whose child it is; ``spawns`` sits beside each
parent and records how many children it has and how many are spawned, in
the transaction that creates them; ``child_wakes`` is where a finishing
child leaves word for its parent, in the child's own transaction and on
the child's own shard, so that the child never writes its parent's row.

A child's outcome is recorded on its ``children`` row by the transaction
that finishes it (entering a state marked ``outcome``, or a deletion), once:
the first finish counts, so no child is ever counted twice. The parent
counts its children from that column alone (an index-only scan of
``children_outcomes``); a finish no writer recorded (a process of an older
release) is found from the children's own rows when the parent counts
(:func:`unrecorded`) and recorded then.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
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
    outcome: str | None  # None: running
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


def counts(conn: sa.Connection, parent: LabelKey, machine: str) -> dict[str | None, int]:
    """How many of the parent's children of ``machine`` have each outcome (``None``: running),
    from ``children`` alone (an index-only scan of ``children_outcomes``)."""
    rows = fetch_all(conn, _COUNT, {**_parent_params(parent), "sm": machine})
    return {None if outcome is None else str(outcome): int(count) for outcome, count in rows}


_COUNT = """
    SELECT outcome, count(*) FROM children
    WHERE parent_machine = %(parent_sm)s AND parent_key = %(parent_key)s
      AND state_machine = %(sm)s
    GROUP BY outcome
    """


def unrecorded(
    conn: sa.Connection, parent: LabelKey, machine: str, *, limit: int
) -> list[tuple[str, str, bool]]:
    """Up to ``limit`` of the parent's running children as their own rows stand: (name,
    state, deleted); for finishes no writer recorded (a process of an older release)."""
    rows = fetch_all(conn, _UNRECORDED, {**_parent_params(parent), "sm": machine, "limit": limit})
    return [(str(name), str(state), bool(deleted)) for name, state, deleted in rows]


_UNRECORDED = """
    SELECT labels.name, labels.state, labels.deleted
    FROM children
    JOIN labels ON labels.state_machine = children.state_machine
               AND labels.name_key = children.name_key
               AND labels.shard_key = children.shard_key
    WHERE children.parent_machine = %(parent_sm)s AND children.parent_key = %(parent_key)s
      AND children.state_machine = %(sm)s AND children.outcome IS NULL
    LIMIT %(limit)s
    """


def page(
    conn: sa.Connection,
    parent: LabelKey,
    machine: str,
    *,
    after: int,
    limit: int,
    outcome: str | None,
) -> list[ChildRow]:
    """The parent's children after position ``after``, in order; ``outcome``: only those that
    came to it (``running``: those that have not finished)."""
    params = {
        **_parent_params(parent),
        "sm": machine,
        "after": after,
        "limit": limit,
        "outcome": outcome,
    }
    return [ChildRow(*row) for row in fetch_all(conn, _PAGE, params)]


_PAGE = """
    SELECT labels.state_machine, labels.name, labels.state, children.outcome, labels.metadata,
           children.position
    FROM children
    JOIN labels ON labels.state_machine = children.state_machine
               AND labels.name_key = children.name_key
               AND labels.shard_key = children.shard_key
    WHERE children.parent_machine = %(parent_sm)s AND children.parent_key = %(parent_key)s
      AND children.state_machine = %(sm)s AND children.position > %(after)s
      AND (CAST(%(outcome)s AS text) IS NULL
           OR children.outcome = %(outcome)s
           OR (%(outcome)s = 'running' AND children.outcome IS NULL))
    ORDER BY children.position
    LIMIT %(limit)s
    """


def running(conn: sa.Connection, parent: LabelKey, machine: str, *, limit: int) -> list[str]:
    """Names of up to ``limit`` of the parent's children of ``machine`` still running (no
    outcome, not deleted)."""
    params = {**_parent_params(parent), "sm": machine, "limit": limit}
    return [str(row[0]) for row in fetch_all(conn, _RUNNING, params)]


_RUNNING = """
    SELECT labels.name
    FROM children
    JOIN labels ON labels.state_machine = children.state_machine
               AND labels.name_key = children.name_key
               AND labels.shard_key = children.shard_key
    WHERE children.parent_machine = %(parent_sm)s AND children.parent_key = %(parent_key)s
      AND children.state_machine = %(sm)s AND children.outcome IS NULL AND NOT labels.deleted
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


def finish(conn: sa.Connection, finished: Sequence[tuple[LabelKey, str]]) -> None:
    """Children that came to an outcome in ``conn``'s transaction, each (child, outcome): the
    outcome recorded on the child's ``children`` row (once: the first finish counts), word
    left for its parent beside it, and a ``NOTIFY`` for the workers. Nothing is written to a
    parent's row; a label no spawn created has no row, and nothing is written for it."""
    if not finished:
        return
    params = {
        **label_key_arrays(key for key, _ in finished),
        "outcomes": [outcome for _, outcome in finished],
    }
    rows = fetch_all(conn, _FINISH, params)
    if not rows:
        return
    if len(rows) == 1:  # one child: a router insert on its shard (Citus: one-phase commit)
        shard, machine, name, key, parent_shard = rows[0]
        word = {
            "shard_key": shard,
            "parent_machine": machine,
            "parent_name": name,
            "parent_key": key,
            "parent_shard_key": parent_shard,
        }
        run(conn, _LEAVE_ONE_WORD, word)
    else:
        words = {
            "shard_keys": [row[0] for row in rows],
            "parent_machines": [row[1] for row in rows],
            "parent_names": [row[2] for row in rows],
            "parent_keys": [row[3] for row in rows],
            "parent_shard_keys": [row[4] for row in rows],
        }
        run(conn, _LEAVE_WORD, words)
    notify_due(conn)


_FINISH = """
    UPDATE children SET outcome = finished.outcome
    FROM unnest(CAST(%(machines)s AS text[]), CAST(%(keys)s AS bytea[]),
                CAST(%(shard_keys)s AS integer[]), CAST(%(outcomes)s AS text[]))
         AS finished (state_machine, name_key, shard_key, outcome)
    WHERE children.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND children.state_machine = finished.state_machine
      AND children.name_key = finished.name_key AND children.shard_key = finished.shard_key
      AND children.outcome IS NULL
    RETURNING children.shard_key, children.parent_machine, children.parent_name,
              children.parent_key, children.parent_shard_key
    """

_LEAVE_WORD = """
    INSERT INTO child_wakes (shard_key, parent_machine, parent_name, parent_key,
                             parent_shard_key)
    SELECT * FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(parent_machines)s AS text[]),
                         CAST(%(parent_names)s AS text[]), CAST(%(parent_keys)s AS bytea[]),
                         CAST(%(parent_shard_keys)s AS integer[]))
    ON CONFLICT DO NOTHING
    """


_LEAVE_ONE_WORD = """
    INSERT INTO child_wakes (shard_key, parent_machine, parent_name, parent_key,
                             parent_shard_key)
    VALUES (%(shard_key)s, %(parent_machine)s, %(parent_name)s, %(parent_key)s,
            %(parent_shard_key)s)
    ON CONFLICT DO NOTHING
    """
"""One child's word: :data:`_LEAVE_WORD` for one row, as a router statement on Citus (an
``INSERT ... SELECT`` is pulled to the coordinator and copied over another connection)."""


def record_outcomes(conn: sa.Connection, machine: str, outcomes: Sequence[tuple[str, str]]) -> None:
    """Outcomes a parent's count found on its children's own rows that no writer recorded
    (``unrecorded``): recorded now, in the parent's transaction (once, as :func:`finish`)."""
    if not outcomes:
        return
    names = [name for name, _ in outcomes]
    run(  # as a finish, the parents' word aside: their count already read the outcomes
        conn,
        _FINISH,
        {
            **label_key_arrays((machine, name) for name in names),
            "outcomes": [outcome for _, outcome in outcomes],
        },
    )


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
    WHERE shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND (state_machine, name_key, shard_key) IN (
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
