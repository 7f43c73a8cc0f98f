"""Turn a checked document into the immutable model.

Only called after schema and semantic validation found nothing, so the
document's shape and formats can be relied on here.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from routemaster.config.flows import compile_flow
from routemaster.config.formats import parse_duration, parse_time_of_day, split_path
from routemaster.config.model import (
    Action,
    ApiConfig,
    Config,
    ConstantNext,
    ContextNext,
    ContextNextDestination,
    EntryTrigger,
    Feed,
    Gate,
    IntervalTrigger,
    LoggingPlugin,
    MetadataTimezone,
    MetadataTrigger,
    Migration,
    NamedTimezone,
    NextStates,
    NoNext,
    PercentileLease,
    PullWorker,
    Retention,
    RetryPolicy,
    Spawn,
    State,
    StateMachine,
    SubscriptionsConfig,
    SystemTimezone,
    TimerTrigger,
    TimeTrigger,
    Timezone,
    Trigger,
    WebhookHeaderRule,
)
from routemaster.config.receiver_rules import compile_receivers
from routemaster.config.retention import compile_retention
from routemaster.config.source import ConfigPath
from routemaster.config.validation import Checked


def compile_config(
    document: dict[str, Any], checked: Checked, *, sources: tuple[str, ...]
) -> Config:
    retention = compile_retention(document.get("retention"))
    machines = tuple(
        _machine(name, machine, checked, retention)
        for name, machine in document["state_machines"].items()
    )
    plugins = tuple(
        LoggingPlugin(plugin["class"], tuple(plugin.get("kwargs", {}).items()))
        for plugin in document.get("plugins", {}).get("logging", [])
    )
    api = ApiConfig(**document.get("api", {}))
    subscriptions = SubscriptionsConfig(tuple(document.get("subscriptions", {}).get("allow", [])))
    return Config(
        state_machines=machines,
        logging_plugins=plugins,
        api=api,
        sources=sources,
        receivers=compile_receivers(document.get("receivers", [])),
        subscriptions=subscriptions,
        retention=retention,
    )


def _machine(
    name: str, machine: dict[str, Any], checked: Checked, retention: Retention
) -> StateMachine:
    retry = _retry(machine.get("retry"), RetryPolicy())
    path: ConfigPath = ("state_machines", name, "states")
    return StateMachine(
        name=name,
        states=tuple(
            _state(name, state, (*path, index), retry, checked)
            for index, state in enumerate(machine["states"])
        ),
        feeds=tuple(Feed(feed["name"], feed["url"]) for feed in machine.get("feeds", [])),
        webhooks=tuple(
            WebhookHeaderRule(rule["match"], tuple(rule["headers"].items()))
            for rule in machine.get("webhooks", [])
        ),
        retry=retry,
        signing_secret=checked.secrets.get(name),
        search=tuple(tuple(path.split(".")[1:]) for path in machine.get("search", [])),
        migrations=tuple(
            Migration(kind, entry[kind]["from"], entry[kind]["to"])
            for entry in machine.get("migrations", [])
            for kind in ("rename", "move")
            if kind in entry
        ),
        upgrade_strategy=machine.get("upgrade_strategy", "upgrade"),
        abort_to=machine.get("abort_to"),
        retention=compile_retention(machine.get("retention"), retention),
    )


def _state(
    machine: str, state: dict[str, Any], path: ConfigPath, retry: RetryPolicy, checked: Checked
) -> State:
    next_states = _next(state.get("next"))
    outcome = state.get("outcome")
    if "gate" in state:
        return Gate(
            name=state["gate"],
            exit_condition=checked.conditions[(*path, "exit_condition")],
            triggers=tuple(_trigger(trigger) for trigger in state.get("triggers", [])),
            next_states=next_states,
            outcome=outcome,
        )
    if "spawn" in state:
        wait = state.get("wait", "all")
        return Spawn(
            name=state["spawn"],
            machine=state["machine"],
            for_each=_path(state["for_each"]),
            next_states=next_states,
            at_least=None if wait == "all" else 1 if wait == "any" else int(wait["at_least"]),
            on_exit_delete=state.get("on_exit", "keep") == "delete",
            outcome=outcome,
        )
    worker = state.get("worker")
    async_timeout = state.get("async_timeout")
    return Action(
        name=state["action"],
        webhook=state.get("webhook"),
        next_states=next_states,
        retry=_retry(state.get("retry"), retry),
        worker=_worker(worker) if worker is not None else None,
        async_timeout=_duration(async_timeout) if async_timeout is not None else None,
        flow=compile_flow(machine, state["action"], state["flow"]) if "flow" in state else None,
        outcome=outcome,
    )


def _worker(worker: dict[str, Any]) -> PullWorker:
    lease = worker["lease"]
    return PullWorker(
        lease=(
            _duration(lease)
            if isinstance(lease, str)
            else PercentileLease(
                percentile=float(lease["percentile"]),
                min=_duration(lease["min"]),
                max=_duration(lease["max"]),
            )
        ),
        at_most_once=bool(worker.get("at_most_once", False)),
    )


def _duration(text: str) -> datetime.timedelta:
    duration = parse_duration(text)
    assert duration is not None  # checked by validation
    return duration


def _retry(block: dict[str, Any] | None, base: RetryPolicy) -> RetryPolicy:
    """``base`` with the fields ``block`` gives replaced (an action's over its machine's)."""
    if not block:
        return base
    changes: dict[str, Any] = {}
    for key, value in block.items():
        if key in ("initial_delay", "max_delay", "timeout"):
            changes[key] = parse_duration(value)
        elif key == "multiplier":
            changes[key] = float(value)
        else:
            changes[key] = int(value)
    return dataclasses.replace(base, **changes)


def _trigger(trigger: dict[str, Any]) -> Trigger:
    if "metadata" in trigger:
        return MetadataTrigger(_path(trigger["metadata"]))
    if "interval" in trigger:
        interval = parse_duration(trigger["interval"])
        assert interval is not None  # checked by validation
        return IntervalTrigger(interval)
    if "time" in trigger:
        time = parse_time_of_day(trigger["time"])
        assert time is not None  # checked by validation
        return TimeTrigger(time, _timezone(trigger.get("timezone")))
    if trigger["event"] == "timer":
        return TimerTrigger()
    return EntryTrigger()


def _timezone(name: str | None) -> Timezone:
    if name is None:
        return SystemTimezone()
    if name.startswith("metadata."):
        return MetadataTimezone(_path(name))
    return NamedTimezone(name)


def _next(next_: Any) -> NextStates:
    if next_ is None:
        return NoNext()
    if isinstance(next_, str):
        return ConstantNext(next_)
    if next_["type"] == "constant":
        return ConstantNext(next_["state"])
    return ContextNext(
        path=_path(next_["path"]),
        default=next_["default"],
        destinations=tuple(
            ContextNextDestination(value=destination["value"], state=destination["state"])
            for destination in next_["destinations"]
        ),
    )


def _path(text: str) -> tuple[str, ...]:
    parts = split_path(text)
    assert parts is not None  # checked by validation
    return parts
