"""Claims from flows (SPEC G2): queue what became due, then serve the keys in turn.

One claim of a flow, in the caller's transaction (:func:`serve_flow`):

1. queue up to :data:`ENQUEUE_BATCH` labels newly due in the flow's states under their
   keys, activating those keys (:func:`routemaster.db.flows.enqueue`);
2. lock the active keys with the least virtual start, a few more than there are slots;
   count each one's holders (the cap) and lock the heads of their queues, at most the
   key's room under its cap;
3. pick heads in start-time fair order (:mod:`routemaster.machine.fair_share`), reading the
   next keys only while the slots are not filled (a key at its cap, or whose queue turned
   out empty, gives way to the next);
4. lease the picked labels, write the served keys' virtual starts, deactivate keys whose
   queue is empty.

Its cost is the labels queued (once each) plus the keys read: those served, those at
their cap (at most one per label holding a slot) and those found empty (once each per
time they became active) — never the keys or labels that merely wait.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.config.model import Action, Config
from routemaster.db import flows
from routemaster.db.claimed import Claim
from routemaster.db.flows import FlowRoute, Head
from routemaster.db.tasks import LeasedState, Task
from routemaster.machine.fair_share import KeyQueue, serve

ENQUEUE_BATCH = 2000  # labels queued per flow and claim (each is queued once)
EXTRA_KEYS = 8  # keys read beyond the slots, for those at their cap or found empty
RECHECK = datetime.timedelta(milliseconds=100)  # wake-up while labels wait for a cap

StateKey = tuple[str, str]


@dataclass(frozen=True)
class FlowTaken:
    """Labels leased from one flow (``claims``, with when each was queued) and whether
    queued labels were left waiting (a cap, or no more slots)."""

    claims: list[tuple[Claim, datetime.datetime, str | None]]  # (claim, queued, last error)
    backlog: bool


def flow_states(config: Config) -> dict[StateKey, FlowRoute]:
    """Every action with a ``flow``, with all the states that name its flow."""
    found: dict[StateKey, tuple[Action, str]] = {}
    for machine in config.state_machines:
        for state in machine.states:
            if isinstance(state, Action) and state.flow is not None:
                found[(machine.name, state.name)] = (state, state.flow.name)
    by_name: dict[str, list[StateKey]] = {}
    for key, (_, name) in found.items():
        by_name.setdefault(name, []).append(key)
    routes: dict[StateKey, FlowRoute] = {}
    for key, (action, name) in found.items():
        flow = action.flow
        assert flow is not None
        routes[key] = FlowRoute(
            name=name,
            states=[key],
            all_states=by_name[name],
            key=flow.key,
            weight=flow.weight,
            concurrency=flow.concurrency,
            pulled=action.pulled,
        )
    return routes


def group_flows(routes: dict[StateKey, FlowRoute], states: Collection[StateKey]) -> list[FlowRoute]:
    """The flows of ``states``, one route each with those of its states among ``states``."""
    grouped: dict[str, FlowRoute] = {}
    for key in sorted(states):
        route = routes.get(key)
        if route is None:
            continue
        known = grouped.get(route.name)
        grouped[route.name] = (
            route
            if known is None
            else FlowRoute(**{**known.__dict__, "states": [*known.states, key]})
        )
    return list(grouped.values())


def serve_flow(
    conn: sa.Connection,
    flow: FlowRoute,
    slots: int,
    *,
    now: datetime.datetime,
    lease_until: datetime.datetime,
    worker_id: str,
    counted: bool = True,
) -> FlowTaken:
    """Lease up to ``slots`` queued labels of ``flow`` for calls, fairly across its keys."""
    flows.enqueue(conn, flow, now=now, limit=ENQUEUE_BATCH)
    picked = pick(conn, flow, slots, now=now)
    rows = flows.lease_heads(
        conn, picked.heads, lease_until=lease_until, worker_id=worker_id, counted=counted
    )
    rows.sort(key=lambda row: row[-1])
    claims = [
        (Claim(sm, name, state, metadata, entry_id, attempts, version), queued_at, error)
        for sm, name, state, metadata, entry_id, attempts, queued_at, error, version, _ in rows
    ]
    return FlowTaken(claims, picked.backlog)


@dataclass(frozen=True)
class Picked:
    heads: list[Head]
    backlog: bool


def pick(conn: sa.Connection, flow: FlowRoute, slots: int, *, now: datetime.datetime) -> Picked:
    """Choose (and lock) up to ``slots`` queued labels of ``flow`` in fair order, writing the
    keys' new virtual starts; the caller leases the heads in the same transaction."""
    chosen: list[Head] = []
    pending: list[KeyQueue[Head]] = []
    vstarts: dict[str, float] = {}
    vtime: float | None = None
    maybe_empty: list[str] = []
    backlog = False
    after: tuple[float, str] | None = None
    while len(chosen) < slots:
        left = slots - len(chosen)
        limit = left + EXTRA_KEYS
        batch = flows.lock_keys(conn, flow.name, after=after, limit=limit)
        more = len(batch) == limit
        if batch:
            after = (batch[-1].vstart, batch[-1].key)
        held = (
            flows.holding(conn, flow, [k.key for k in batch], now=now)
            if flow.concurrency is not None
            else {}
        )
        rooms = {k.key: _room(flow.concurrency, held.get(k.key, 0), left) for k in batch}
        backlog = backlog or any(room <= 0 for room in rooms.values())
        found = flows.heads(conn, flow, rooms)
        maybe_empty += [k.key for k in batch if rooms[k.key] > 0 and not found.get(k.key)]
        pending += [
            KeyQueue(k.key, k.vstart, k.weight, found[k.key]) for k in batch if k.key in found
        ]
        served = serve(pending, left, below=after if more else None)
        chosen += served.chosen
        vstarts.update(served.vstarts)
        if served.vtime is not None:
            vtime = served.vtime if vtime is None else max(vtime, served.vtime)
        pending = [queue for queue in pending if queue.heads]
        if not more:
            break
    backlog = backlog or bool(pending)
    flows.settle_keys(conn, flow.name, vstarts=vstarts, maybe_empty=maybe_empty, vtime=vtime)
    return Picked(chosen, backlog)


def _room(concurrency: int | None, holding: int, slots: int) -> int:
    return slots if concurrency is None else min(slots, concurrency - holding)


def claim_flow_tasks(
    conn: sa.Connection,
    by_state: dict[StateKey, FlowRoute],
    leased: Sequence[LeasedState],
    ids: Sequence[str],
    *,
    worker: str,
    now: datetime.datetime,
) -> list[Task]:
    """Pull tasks from the flows of ``leased`` states, up to ``len(ids)``, fairly by key
    and under each key's cap; the ids not used are the caller's to use elsewhere."""
    lease_of = {(sm, state): lease for sm, state, lease in leased}
    tasks: list[Task] = []
    for flow in group_flows(by_state, list(lease_of)):
        left = len(ids) - len(tasks)
        if left <= 0:
            break
        flows.enqueue(conn, flow, now=now, limit=ENQUEUE_BATCH)
        picked = pick(conn, flow, left, now=now)
        fresh = ids[len(tasks) : len(tasks) + len(picked.heads)]
        chosen = [
            (head, ident, lease_of[(head.state_machine, head.state)])
            for head, ident in zip(picked.heads, fresh, strict=True)
        ]
        tasks += flows.lease_tasks(conn, chosen, worker=worker, now=now)
    return tasks


def flows_of(
    routes: Sequence[tuple[str, str, str]], by_state: dict[StateKey, FlowRoute]
) -> dict[str, list[FlowRoute]]:
    """Per receiver, the flows of its routes."""
    states: dict[str, list[StateKey]] = {}
    for receiver, sm, state in routes:
        if (sm, state) in by_state:
            states.setdefault(receiver, []).append((sm, state))
    return {receiver: group_flows(by_state, keys) for receiver, keys in states.items()}
