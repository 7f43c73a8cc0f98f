"""Flows (SPEC G2): labels queued per key, keys served in order of virtual start, the cap
kept exact by counting a key's holders under its row's lock.

The rows (migration 0020):

- a label due in a flow's action is **queued** by :func:`enqueue`: its flow, its key (the
  JSON text of the key path's value, ``null`` when missing) and the moment it became due
  go to ``flow``, ``flow_key``, ``flow_due_at``, and ``due_at`` becomes NULL. Queued, it
  is out of ``labels_due`` and ``labels_claimable`` (no other claim reads it again) and in
  ``labels_flow_queue``: its key's queue, FIFO. A queued label is one whose
  ``flow_due_at`` is set while ``due_at`` is NULL and it is in one of its flow's states; a
  row left in the index by a label that moved on is cleared when its key's queue is read;
- ``flow_keys``: per (flow, key) its virtual start ``vstart``, its weight and whether it
  may have queued labels (``active``); ``flow_keys_ready`` orders a flow's active keys by
  ``vstart``, so a claim reads the keys it serves and not the others;
- ``flows``: per flow its virtual time, the start of the last label served: a key that
  becomes active again starts no earlier (no credit banked while idle).

The cap: a label **holds** a slot while it is leased in one of its flow's states (a call in
flight, a 202 task, a pull task; ``lease_owner`` set and the lease not run out). A claim
locks the key's row (``FOR UPDATE SKIP LOCKED``), then counts the holders
(``labels_flow_holding``, at most the cap's worth of rows) in a later statement, which
therefore sees every lease committed by a claim that held the row before; and it writes
its own leases before it commits. Two claims of one key are thereby serialised, so no
instant has more holders than the cap. Ends of holding need no bookkeeping: a lease that
ends (moved on, failed, released, run out) is simply not counted.

Keys are deactivated only under their row's lock, after a later statement found their
queue empty; :func:`enqueue` activates them by an upsert that waits for that lock, so a
label queued concurrently is never left behind an inactive key.

On Citus ``flows`` and ``flow_keys`` are local tables of the coordinator (never joined with
``labels`` in one statement), and the statements that lock labels run shard by shard
(:mod:`routemaster.db.shards`), their ``%(shard_keys)s`` NULL on one server.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.labels import label_params
from routemaster.db.shards import shard_map
from routemaster.db.statements import Row, fetch_all, fetch_one, run
from routemaster.db.tasks import TASKS_ISSUED, Lease, Task, claimed_columns

StateKey = tuple[str, str]


@dataclass(frozen=True)
class FlowRoute:
    """What the store needs of one flow: its name, the states it claims from now (and all of
    its states, for the holders), its key and weight paths (without ``metadata``)."""

    name: str
    states: Sequence[StateKey]  # where labels are queued and claimed from by this claim
    all_states: Sequence[StateKey]  # where holders count (every action naming the flow)
    key: Sequence[str]
    weight: Sequence[str] | None
    concurrency: int | None
    pulled: bool = False  # a pull action: run-out leases are the expiry sweep's, not ours


@dataclass(frozen=True)
class FlowKey:
    key: str
    vstart: float
    weight: float


@dataclass(frozen=True)
class Head:
    """A queued label at the head of its key's queue, locked."""

    key: str
    state_machine: str
    state: str
    name_key: bytes
    shard_key: int
    queued_at: datetime.datetime


def enqueue(conn: sa.Connection, flow: FlowRoute, *, now: datetime.datetime, limit: int) -> int:
    """Queue up to ``limit`` labels due in ``flow.states`` under their keys, oldest first, and
    activate those keys; how many were queued.

    A key that becomes active starts at the flow's virtual time (or later, if it was
    served further ahead before): it banks no credit for being idle.
    """
    params = {
        "flow": flow.name,
        **_state_arrays(flow.states),
        "key_path": list(flow.key),
        "weight_path": list(flow.weight) if flow.weight is not None else None,
        "now": now,
        "limit": limit,
        "unleased": flow.pulled,
        "shard_keys": None,
    }
    rows = _enqueue_rows(conn, params, limit)
    if not rows:
        return 0
    weights: dict[str, float] = {}
    for key, weight in rows:
        weights[key] = max(weight, weights.get(key, 1.0))
    keys = sorted(weights)  # upserts lock the key rows in one order
    run(conn, _ENSURE_FLOW, {"flow": flow.name})
    run(
        conn,
        _ACTIVATE,
        {"flow": flow.name, "keys": keys, "weights": [weights[key] for key in keys]},
    )
    return len(rows)


def _enqueue_rows(conn: sa.Connection, params: dict[str, Any], limit: int) -> list[Row]:
    """Queue: one statement on one server; on Citus the statement on each shard a fresh read
    across the shards finds due labels on (no shards remembered from an earlier round, so a
    newly due label waits for no other shard's backlog), each asked for what is left."""
    shards = shard_map(conn)
    if shards is None:
        return fetch_all(conn, _ENQUEUE, params)
    keys = {int(key) for (key,) in fetch_all(conn, _ENQUEUE_KEYS, params)}
    rows: list[Row] = []
    for group in shards.whole_shards(conn, keys):
        left = limit - len(rows)
        if left <= 0:
            break
        rows += shards.fetch_all(conn, _ENQUEUE, {**params, "limit": left, "shard_keys": group})
    return rows


def lock_keys(
    conn: sa.Connection, flow: str, *, after: tuple[float, str] | None, limit: int
) -> list[FlowKey]:
    """Lock up to ``limit`` active keys of ``flow`` in order of virtual start, after
    ``after`` (skipping keys another claim is serving)."""
    low_v, low_key = after if after is not None else (float("-inf"), "")
    params = {"flow": flow, "low_v": low_v, "low_key": low_key, "limit": limit}
    return [FlowKey(*row) for row in fetch_all(conn, _LOCK_KEYS, params)]


def holding(
    conn: sa.Connection, flow: FlowRoute, keys: Sequence[str], *, now: datetime.datetime
) -> dict[str, int]:
    """How many labels of each of ``keys`` hold a slot of ``flow`` now."""
    if not keys:
        return {}
    params = {"flow": flow.name, "keys": list(keys), "now": now, **_state_arrays(flow.all_states)}
    return {key: int(count) for key, count in fetch_all(conn, _HOLDING, params)}


def heads(conn: sa.Connection, flow: FlowRoute, rooms: dict[str, int]) -> dict[str, list[Head]]:
    """Lock up to ``rooms[key]`` queued labels of each key, oldest first, in ``flow.states``
    (those in the flow's other states stay for the claims of their receivers).

    Rows the index still holds for labels that moved on are cleared on the way (and not
    returned), so each costs one read once.
    """
    keys = [key for key, room in rooms.items() if room > 0]
    if not keys:
        return {}
    params = {
        "flow": flow.name,
        "keys": keys,
        "rooms": [rooms[key] for key in keys],
        **_state_arrays(flow.all_states),
    }
    here = set(flow.states)
    found: dict[str, list[Head]] = {}
    stale: list[Row] = []
    for row in _head_rows(conn, params, rooms):
        key, state_machine, name_key, shard_key, queued_at, live, state = row
        if not live:
            stale.append(row)
            continue
        if (state_machine, state) not in here:  # queued for another receiver's action
            continue
        found.setdefault(key, []).append(
            Head(key, state_machine, state, bytes(name_key), shard_key, queued_at)
        )
    if stale:
        run(
            conn,
            _CLEAR_STALE,
            {
                "shard_keys": [row[3] for row in stale],
                "machines": [row[1] for row in stale],
                "name_keys": [bytes(row[2]) for row in stale],
            },
        )
    return found


def _head_rows(conn: sa.Connection, params: dict[str, Any], rooms: dict[str, int]) -> list[Row]:
    """The heads' rows: one statement on one server; on Citus the statement on every shard
    holding a queued label of those keys (row locks hold within one shard), the rows then
    merged per key in due order and cut to each key's room (FIFO across shards)."""
    shards = shard_map(conn)
    if shards is None:
        return fetch_all(conn, _HEADS, {**params, "shard_keys": None})
    keys: set[int] = set()
    for key in params["keys"]:  # each key's own oldest: one key's backlog hides no other's
        find = {"flow": params["flow"], "key": key, "limit": rooms[key]}
        keys.update(int(found) for (found,) in fetch_all(conn, _HEAD_KEYS, find))
    rows: list[Row] = []
    for group in shards.whole_shards(conn, keys):
        rows += shards.fetch_all(conn, _HEADS, {**params, "shard_keys": group})
    rows.sort(key=lambda row: row[4])
    taken: dict[str, int] = {}
    kept = []
    for row in rows:
        if taken.get(row[0], 0) < rooms.get(row[0], 0):
            taken[row[0]] = taken.get(row[0], 0) + 1
            kept.append(row)
    return kept


def lease_heads(
    conn: sa.Connection,
    chosen: Sequence[Head],
    *,
    lease_until: datetime.datetime,
    worker_id: str,
    counted: bool,
) -> list[Row]:
    """Lease the chosen heads for calls: (state_machine, name, state, metadata, entry_id,
    attempts, was_due, last_error, version), in the order chosen."""
    if not chosen:
        return []
    params = {
        "shard_keys": [head.shard_key for head in chosen],
        "machines": [head.state_machine for head in chosen],
        "name_keys": [head.name_key for head in chosen],
        "queued": [head.queued_at for head in chosen],
        "lease_until": lease_until,
        "me": worker_id,
        "counted": int(counted),
    }
    return fetch_all(conn, _LEASE_HEADS, params)


def lease_tasks(
    conn: sa.Connection,
    chosen: Sequence[tuple[Head, str, Lease]],
    *,
    worker: str,
    now: datetime.datetime,
) -> list[Task]:
    """Lease the chosen heads of pull actions as tasks, (head, id, lease) each, recorded in
    ``tasks`` as a pull claim's are (:mod:`routemaster.db.label_claims`), in that order."""
    if not chosen:
        return []
    params = {
        "shard_keys": [head.shard_key for head, _, _ in chosen],
        "machines": [head.state_machine for head, _, _ in chosen],
        "name_keys": [head.name_key for head, _, _ in chosen],
        "ids": [ident for _, ident, _ in chosen],
        "leases": [lease.seconds for _, _, lease in chosen],
        # computed here, as the pull claim does (Citus refuses timestamptz + interval of a
        # column in an UPDATE)
        "lease_untils": [now + datetime.timedelta(seconds=lease.seconds) for _, _, lease in chosen],
        "sources": [lease.source for _, _, lease in chosen],
        "samples": [lease.samples for _, _, lease in chosen],
        "worker": worker,
        "now": now,
    }
    shards = shard_map(conn)
    if shards is None:
        return [Task(*row) for row in fetch_all(conn, _LEASE_TASKS, params)]
    # On Citus the statement (an UPDATE and an INSERT) runs shard by shard, as a pull claim's.
    tasks: list[Task] = []
    for group in shards.groups(conn, {head.shard_key for head, _, _ in chosen}, ordered=True):
        some = [i for i, (head, _, _) in enumerate(chosen) if head.shard_key in set(group)]
        part = {
            name: ([value[i] for i in some] if isinstance(value, list) else value)
            for name, value in params.items()
        }
        tasks += [Task(*row) for row in shards.fetch_all(conn, _LEASE_TASKS, part)]
    order = {ident: n for n, (_, ident, _) in enumerate(chosen)}
    return sorted(tasks, key=lambda task: order[task.id.split(".", 1)[1]])


def settle_keys(
    conn: sa.Connection,
    flow: str,
    *,
    vstarts: dict[str, float],
    maybe_empty: Sequence[str],
    vtime: float | None,
) -> None:
    """Write the served keys' new virtual starts and the flow's virtual time; forget those
    of ``maybe_empty`` (locked by this claim) whose queue a fresh read finds empty."""
    if vstarts:
        keys = sorted(vstarts)
        run(
            conn,
            _SET_VSTARTS,
            {"flow": flow, "keys": keys, "vstarts": [vstarts[key] for key in keys]},
        )
    if vtime is not None:
        run(conn, _SET_VTIME, {"flow": flow, "vtime": vtime})
    if maybe_empty:
        params = {"flow": flow, "keys": sorted(maybe_empty)}
        queued = {key for (key,) in fetch_all(conn, _STILL_QUEUED, params)}
        empty = [key for key in sorted(maybe_empty) if key not in queued]
        if empty:
            run(conn, _DEACTIVATE, {"flow": flow, "keys": empty})


def _state_arrays(states: Sequence[StateKey]) -> dict[str, Any]:
    return {"machines": [sm for sm, _ in states], "states": [state for _, state in states]}


# Due labels of the flow's states (each state's own scan of labels_claimable, oldest first),
# queued: due_at moves to flow_due_at, the key and weight are read from the metadata. A pull
# action's run-out leases are left to the expiry sweep (it counts the failed attempt first).
_ENQUEUE = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[]))
                 AS r(sm, state)
    ), due AS (
        SELECT picked.* FROM routes CROSS JOIN LATERAL (
            SELECT shard_key, state_machine, name_key FROM labels
            WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
                   OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
              AND state_machine = routes.sm AND state = routes.state AND due_at IS NOT NULL
              AND (state, due_at) <= (routes.state, %(now)s)
              AND NOT deleted AND NOT paused AND NOT errored
              AND (NOT %(unleased)s OR lease_owner IS NULL)
            ORDER BY due_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS picked
    )
    UPDATE labels
    SET flow = %(flow)s,
        flow_key = COALESCE(CAST(labels.metadata #> CAST(%(key_path)s AS text[]) AS text),
                            'null'),
        flow_due_at = labels.due_at, due_at = NULL, lease_owner = NULL
    FROM due
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND labels.shard_key = due.shard_key AND labels.state_machine = due.state_machine
      AND labels.name_key = due.name_key
    RETURNING labels.flow_key,
              CASE WHEN jsonb_typeof(labels.metadata #> CAST(%(weight_path)s AS text[]))
                        = 'number'
                   THEN GREATEST(1, CAST(CAST(labels.metadata #> CAST(%(weight_path)s AS text[])
                                              AS text) AS double precision))
                   ELSE 1 END
    """

# On Citus (routemaster.db.shards): the shard keys of the oldest such labels, read without a
# lock across the shards (which shards to visit).
_ENQUEUE_KEYS = """
    SELECT shard_key FROM labels
    WHERE (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
      AND due_at <= %(now)s AND NOT deleted AND NOT paused AND NOT errored
      AND (NOT %(unleased)s OR lease_owner IS NULL)
    ORDER BY due_at
    LIMIT %(limit)s
    """

_ENSURE_FLOW = "INSERT INTO flows (name) VALUES (%(flow)s) ON CONFLICT (name) DO NOTHING"

# A key that was idle starts at the flow's virtual time (no credit for idling); an active
# key keeps its place. Waits for a claim holding the key's row (it may be deactivating it).
_ACTIVATE = """
    INSERT INTO flow_keys (flow, key, vstart, weight, active)
    SELECT %(flow)s, k.key, (SELECT vtime FROM flows WHERE name = %(flow)s), k.weight, true
    FROM unnest(CAST(%(keys)s AS text[]), CAST(%(weights)s AS double precision[]))
         AS k(key, weight)
    ON CONFLICT (flow, key) DO UPDATE
    SET weight = excluded.weight, active = true,
        vstart = CASE WHEN flow_keys.active THEN flow_keys.vstart
                      ELSE GREATEST(flow_keys.vstart, excluded.vstart) END
    """

# The next active keys in order of virtual start (index flow_keys_ready), locked.
_LOCK_KEYS = """
    SELECT key, vstart, weight FROM flow_keys
    WHERE flow = %(flow)s AND active AND (vstart, key) > (%(low_v)s, %(low_key)s)
    ORDER BY vstart, key
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

# The labels holding a slot of each key: leased in one of the flow's states, the lease not
# run out (index labels_flow_holding).
_HOLDING = """
    SELECT flow_key, count(*) FROM labels
    WHERE flow = %(flow)s AND flow_key = ANY(CAST(%(keys)s AS text[]))
      AND lease_owner IS NOT NULL AND due_at > %(now)s AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    GROUP BY flow_key
    """

# Each key's oldest queued labels (labels_flow_queue), locked; ``live`` false for a row left
# by a label no longer queued there (it moved on, or is due again another way).
_HEADS = """
    SELECT picked.* FROM unnest(CAST(%(keys)s AS text[]), CAST(%(rooms)s AS integer[]))
                         AS k(key, room)
    CROSS JOIN LATERAL (
        SELECT labels.flow_key, labels.state_machine, labels.name_key, labels.shard_key,
               labels.flow_due_at,
               labels.due_at IS NULL
               AND (labels.state_machine, labels.state) IN (
                   SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                        CAST(%(states)s AS text[]))) AS live,
               labels.state
        FROM labels
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.flow = %(flow)s AND labels.flow_key = k.key
          AND labels.flow_due_at IS NOT NULL
          AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
        ORDER BY labels.flow_due_at
        LIMIT k.room
        FOR UPDATE SKIP LOCKED
    ) AS picked
    """

# On Citus: the shard keys of the oldest queued labels of one key, read without a lock.
_HEAD_KEYS = """
    SELECT shard_key FROM labels
    WHERE flow = %(flow)s AND flow_key = %(key)s
      AND flow_due_at IS NOT NULL AND NOT deleted AND NOT paused AND NOT errored
    ORDER BY flow_due_at
    LIMIT %(limit)s
    """

_CLEAR_STALE = """
    UPDATE labels SET flow_due_at = NULL
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(name_keys)s AS bytea[])) AS s(shard_key, sm, name_key)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = s.shard_key AND labels.state_machine = s.sm
      AND labels.name_key = s.name_key
    """

_LEASE_HEADS = """
    UPDATE labels SET due_at = %(lease_until)s, lease_owner = %(me)s, flow_due_at = NULL,
                      attempts = labels.attempts + %(counted)s
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(name_keys)s AS bytea[]), CAST(%(queued)s AS timestamptz[]))
         WITH ORDINALITY AS h(shard_key, sm, name_key, queued_at, n)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = h.shard_key AND labels.state_machine = h.sm
      AND labels.name_key = h.name_key
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, h.queued_at, labels.last_error, labels.version,
              h.n
    """

_LEASE_TASKS = f"""
    WITH chosen AS (
        SELECT * FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                             CAST(%(name_keys)s AS bytea[]), CAST(%(ids)s AS text[]),
                             CAST(%(leases)s AS double precision[]),
                             CAST(%(lease_untils)s AS timestamptz[]),
                             CAST(%(sources)s AS text[]), CAST(%(samples)s AS integer[]))
                      WITH ORDINALITY
                      AS c(shard_key, sm, name_key, id, lease, lease_until, lease_source,
                           lease_samples, n)
    ), claimed AS (
        UPDATE labels SET due_at = chosen.lease_until, lease_owner = %(worker)s,
                          flow_due_at = NULL,
                          task_id = CAST(labels.shard_key AS text) || '.' || chosen.id,
                          attempts = labels.attempts + 1
        FROM chosen
        WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
          AND labels.shard_key = chosen.shard_key AND labels.state_machine = chosen.sm
          AND labels.name_key = chosen.name_key
        RETURNING {claimed_columns("chosen")}
    ), {TASKS_ISSUED}
    """

_SET_VSTARTS = """
    UPDATE flow_keys SET vstart = v.vstart
    FROM unnest(CAST(%(keys)s AS text[]), CAST(%(vstarts)s AS double precision[]))
         AS v(key, vstart)
    WHERE flow_keys.flow = %(flow)s AND flow_keys.key = v.key
    """

_SET_VTIME = "UPDATE flows SET vtime = GREATEST(vtime, %(vtime)s) WHERE name = %(flow)s"

_STILL_QUEUED = """
    SELECT DISTINCT flow_key FROM labels
    WHERE flow = %(flow)s AND flow_key = ANY(CAST(%(keys)s AS text[]))
      AND flow_due_at IS NOT NULL AND NOT deleted AND NOT paused AND NOT errored
    """

# An idle key is forgotten: the table holds the keys with queued labels (and those being
# queued), so it never grows with the keys ever seen. What it forgets is at most one call's
# lead (a key served just before it went idle starts again at the virtual time).
_DEACTIVATE = """
    DELETE FROM flow_keys WHERE flow = %(flow)s AND key = ANY(CAST(%(keys)s AS text[]))
    """


# --- reads: a label's place, the flows' and keys' counts ---------------------------------


@dataclass(frozen=True)
class Queued:
    """A label queued in a flow: its flow, key (JSON text) and since when."""

    flow: str
    key: str
    since: datetime.datetime


def queued(conn: sa.Connection, state_machine: str, name: str) -> Queued | None:
    """Where the label waits in a flow's queue (None: it is not queued)."""
    row = fetch_one(conn, _QUEUED, label_params(state_machine, name))
    return None if row is None else Queued(*row)


def requeue(conn: sa.Connection, state_machine: str, name: str) -> bool:
    """A queued label resumed after a pause: due again at the moment it was queued, so the
    next claim queues it (and activates its key, which may have gone idle meanwhile)."""
    return run(conn, _REQUEUE, label_params(state_machine, name)) > 0


def holding_of(
    conn: sa.Connection,
    flow: str,
    states: Sequence[StateKey],
    key: str,
    *,
    now: datetime.datetime,
) -> int:
    route = FlowRoute(flow, states, states, (), None, None)
    return holding(conn, route, [key], now=now).get(key, 0)


@dataclass(frozen=True)
class FlowCounts:
    name: str
    keys_waiting: int
    labels_waiting: int
    holding: int


def flow_counts(
    conn: sa.Connection, flows: Sequence[tuple[str, Sequence[StateKey]]], *, now: datetime.datetime
) -> list[FlowCounts]:
    """Per flow (name, its states): keys and labels waiting in its queues, labels holding."""
    found = []
    for name, states in flows:
        params = {"flow": name, "now": now, **_state_arrays(states)}
        keys, labels = fetch_one(conn, _WAITING, params) or (0, 0)
        held = fetch_one(conn, _HOLDING_ALL, params)
        found.append(FlowCounts(name, int(keys), int(labels), int(held[0]) if held else 0))
    return found


@dataclass(frozen=True)
class KeyCounts:
    key: str  # JSON text
    waiting: int
    holding: int


def busiest_keys(
    conn: sa.Connection,
    flow: str,
    states: Sequence[StateKey],
    *,
    limit: int,
    now: datetime.datetime,
) -> list[KeyCounts]:
    """The keys of ``flow`` with the most labels waiting, most first (ties by key)."""
    params = {"flow": flow, "limit": limit, "now": now, **_state_arrays(states)}
    rows = fetch_all(conn, _BUSIEST, params)
    held = holding(
        conn, FlowRoute(flow, states, states, (), None, None), [r[0] for r in rows], now=now
    )
    return [KeyCounts(key, int(waiting), held.get(key, 0)) for key, waiting in rows]


_QUEUED = """
    SELECT flow, flow_key, flow_due_at FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND flow_due_at IS NOT NULL AND due_at IS NULL
    """

_REQUEUE = """
    UPDATE labels SET due_at = flow_due_at, flow_due_at = NULL
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND flow_due_at IS NOT NULL AND due_at IS NULL AND NOT paused
    """

# Counted from labels_flow_queue (what waits) and labels_flow_holding: reads, never claims.
_WAITING = """
    SELECT count(DISTINCT flow_key), count(*) FROM labels
    WHERE flow = %(flow)s AND flow_due_at IS NOT NULL AND due_at IS NULL
      AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    """

_HOLDING_ALL = """
    SELECT count(*) FROM labels
    WHERE flow = %(flow)s AND lease_owner IS NOT NULL AND due_at > %(now)s
      AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    """

_BUSIEST = """
    SELECT flow_key, count(*) AS waiting FROM labels
    WHERE flow = %(flow)s AND flow_due_at IS NOT NULL AND due_at IS NULL
      AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    GROUP BY flow_key
    ORDER BY waiting DESC, flow_key
    LIMIT %(limit)s
    """
