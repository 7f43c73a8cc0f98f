"""Read models of flows (SPEC G2): a label's place in its key's queue, each flow's counts,
its busiest keys. Claims are :mod:`routemaster.service.flow_claims`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from routemaster.app import App
from routemaster.config.model import Action, Config, Flow
from routemaster.db import flows as store
from routemaster.db.labels import Label
from routemaster.service.transactions import reading

StateKey = tuple[str, str]


@dataclass(frozen=True)
class FlowInfo:
    name: str
    concurrency: int | None
    states: list[StateKey]


def configured_flows(config: Config) -> dict[str, FlowInfo]:
    """Every flow the configuration names, with the states that name it, by name."""
    found: dict[str, FlowInfo] = {}
    for machine in config.state_machines:
        for state in machine.states:
            if isinstance(state, Action) and state.flow is not None:
                flow = state.flow
                info = found.setdefault(flow.name, FlowInfo(flow.name, flow.concurrency, []))
                info.states.append((machine.name, state.name))
    return dict(sorted(found.items()))


def waiting_for(app: App, flow: Flow, label: Label) -> dict[str, Any] | None:
    """``explain``'s ``waiting_for``: the key the label waits for, its holders and cap."""
    info = configured_flows(app.config).get(flow.name)
    states = info.states if info is not None else [(label.state_machine, label.state)]
    with reading(app) as conn:
        queued = store.queued(conn, label.state_machine, label.name)
        if queued is None or queued.flow != flow.name:
            return None
        holding = store.holding_of(conn, flow.name, states, queued.key, now=app.now())
    return {
        "flow": flow.name,
        "key": json.loads(queued.key),
        "holding": holding,
        "concurrency": flow.concurrency,
        "since": queued.since,
    }


def flow_list(app: App) -> list[dict[str, Any]]:
    """``GET /flows``: per flow, the keys and labels waiting and the labels holding slots."""
    flows = configured_flows(app.config)
    with reading(app) as conn:
        counts = store.flow_counts(
            conn, [(info.name, info.states) for info in flows.values()], now=app.now()
        )
    return [
        {
            "name": count.name,
            "concurrency": flows[count.name].concurrency,
            "keys_waiting": count.keys_waiting,
            "labels_waiting": count.labels_waiting,
            "holding": count.holding,
        }
        for count in counts
    ]


def busiest_keys(app: App, name: str, *, limit: int) -> list[dict[str, Any]] | None:
    """``GET /flows/{name}/keys``: the keys with the most labels waiting (None: no such flow)."""
    info = configured_flows(app.config).get(name)
    if info is None:
        return None
    with reading(app) as conn:
        keys = store.busiest_keys(conn, name, info.states, limit=limit, now=app.now())
    return [
        {"key": json.loads(key.key), "waiting": key.waiting, "holding": key.holding} for key in keys
    ]
