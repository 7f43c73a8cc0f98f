"""A state machine as JSON-safe data: for the API, the web page and ``validate``."""

from __future__ import annotations

from typing import Any

from routemaster.config.model import (
    Action,
    ConstantNext,
    ContextNext,
    EntryTrigger,
    Gate,
    IntervalTrigger,
    MetadataTimezone,
    MetadataTrigger,
    NamedTimezone,
    NextStates,
    NoNext,
    PercentileLease,
    PullWorker,
    Spawn,
    State,
    StateMachine,
    TimerTrigger,
    TimeTrigger,
    Trigger,
)


def describe_machine(machine: StateMachine) -> dict[str, Any]:
    """States (with kind, triggers, condition and next rule), edges between them, feeds."""
    states = []
    edges: list[dict[str, Any]] = []
    for state in machine.states:
        gate = state if isinstance(state, Gate) else None
        described = {
            "name": state.name,
            "kind": _kind(state),
            "exit_condition": gate.exit_condition.source if gate else None,
            "triggers": [_trigger(trigger) for trigger in gate.triggers] if gate else [],
            "webhook": state.webhook if isinstance(state, Action) else None,
            "worker": _worker(state),
            "next": _next(state.next_states),
            "end": isinstance(state.next_states, NoNext),
        }
        if state.outcome is not None:
            described["outcome"] = state.outcome
        if isinstance(state, Spawn):
            described["spawn"] = spawn_settings(state)
        states.append(described)
        edges.extend(_edges(state.name, state.next_states))
    return {
        "name": machine.name,
        "states": states,
        "edges": edges,
        "feeds": [{"name": feed.name, "url": feed.url} for feed in machine.feeds],
    }


def _kind(state: State) -> str:
    if isinstance(state, Gate):
        return "gate"
    return "spawn" if isinstance(state, Spawn) else "action"


def spawn_settings(spawn: Spawn) -> dict[str, Any]:
    """A spawn state's settings as the API shows (and a stored definition keeps) them."""
    return {
        "machine": spawn.machine,
        "for_each": ".".join(spawn.for_each),
        "wait": "all" if spawn.at_least is None else {"at_least": spawn.at_least},
        "on_exit": "delete" if spawn.on_exit_delete else "keep",
    }


def _worker(state: State) -> dict[str, Any] | None:
    """A pull action's lease in seconds (``worker: {lease}``); ``None`` for anything else."""
    if isinstance(state, Action) and state.worker is not None:
        return worker_settings(state.worker)
    return None


def worker_settings(worker: PullWorker) -> dict[str, Any]:
    """A pull action's settings as the API shows them: the lease in seconds, or its percentile."""
    lease = worker.lease
    shown: dict[str, Any] = (
        {
            "percentile": lease.percentile,
            "min": int(lease.min.total_seconds()),
            "max": int(lease.max.total_seconds()),
        }
        if isinstance(lease, PercentileLease)
        else {"lease": int(lease.total_seconds())}
    )
    return shown | {"at_most_once": worker.at_most_once}


def _trigger(trigger: Trigger) -> dict[str, Any]:
    if isinstance(trigger, MetadataTrigger):
        return {"kind": "metadata", "path": ".".join(trigger.path)}
    if isinstance(trigger, IntervalTrigger):
        return {"kind": "interval", "seconds": trigger.interval.total_seconds()}
    if isinstance(trigger, TimeTrigger):
        if isinstance(trigger.timezone, NamedTimezone):
            zone = trigger.timezone.name
        elif isinstance(trigger.timezone, MetadataTimezone):
            zone = ".".join(trigger.timezone.path)
        else:
            zone = "system"
        return {"kind": "time", "time": trigger.time.isoformat(), "timezone": zone}
    if isinstance(trigger, TimerTrigger):
        return {"kind": "event", "event": "timer"}
    assert isinstance(trigger, EntryTrigger)
    return {"kind": "event", "event": "entry"}


def _next(next_states: NextStates) -> dict[str, Any]:
    if isinstance(next_states, ConstantNext):
        return {"type": "constant", "state": next_states.state}
    if isinstance(next_states, ContextNext):
        return {
            "type": "context",
            "path": ".".join(next_states.path),
            "default": next_states.default,
            "destinations": [
                {"value": destination.value, "state": destination.state}
                for destination in next_states.destinations
            ],
        }
    return {"type": "none"}


def _edges(source: str, next_states: NextStates) -> list[dict[str, Any]]:
    if isinstance(next_states, ConstantNext):
        return [{"from": source, "to": next_states.state, "kind": "constant"}]
    if isinstance(next_states, ContextNext):
        edges = [
            {
                "from": source,
                "to": destination.state,
                "kind": "context",
                "value": destination.value,
            }
            for destination in next_states.destinations
        ]
        edges.append({"from": source, "to": next_states.default, "kind": "default"})
        return edges
    return []
