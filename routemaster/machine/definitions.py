"""Which machine definition governs a label: the one place the whole service asks (SPEC E4).

Pure. A machine whose ``upgrade_strategy`` is ``continue`` runs each label
under the version it was created under; every other machine runs every
label under the definition in force (the configuration). Older versions'
definitions are stored as JSON (``machine_versions``, the machine as
``describe_machine`` shows it); :func:`compile_definition` turns one back
into a runnable :class:`StateMachine` once per version (conditions compiled
once, then cached in :class:`LoadedVersions`), never per label.

What a version's definition does not hold comes from the configuration in
force: the ``webhooks:`` header rules (matched against that version's URL
templates, as for any state), the signing secret, retry settings (an
action's own where the configuration still has an action of that name, else
the machine's), ``async_timeout``, search paths and migrations.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from routemaster.config.formats import parse_time_of_day
from routemaster.config.model import (
    Action,
    Config,
    ConstantNext,
    ContextNext,
    ContextNextDestination,
    EntryTrigger,
    Feed,
    Gate,
    IntervalTrigger,
    MetadataTimezone,
    MetadataTrigger,
    NamedTimezone,
    NextStates,
    NoNext,
    PullWorker,
    Spawn,
    State,
    StateMachine,
    SystemTimezone,
    TimerTrigger,
    TimeTrigger,
    Timezone,
    Trigger,
)
from routemaster.exit_conditions import compile_condition

VersionKey = tuple[str, int]
"""(machine, version)."""


@dataclass(frozen=True)
class LoadedVersions:
    """The versions a process knows: its own per machine, and older ones compiled.

    ``in_force``: machine -> the version of the definition this process runs
    (recorded at start; empty when none was recorded, as in tests that build
    an App by hand). ``compiled``: (machine, version) -> that version's
    runnable definition, for ``continue`` machines' older (or newer) labels.
    Immutable: a process swaps in a new one when it learns a version.
    """

    in_force: Mapping[str, int] = field(default_factory=dict)
    compiled: Mapping[VersionKey, StateMachine] = field(default_factory=dict)

    def with_compiled(self, found: Mapping[VersionKey, StateMachine]) -> LoadedVersions:
        return dataclasses.replace(self, compiled={**self.compiled, **found})


def definition_for(
    config: Config, loaded: LoadedVersions, machine: str, version: int | None
) -> StateMachine | None:
    """The definition that governs a label of ``machine`` recorded with ``version``.

    The configuration's machine, unless the machine ``continue``s and the
    label's version is another than the one in force: then that version's
    compiled definition, or ``None`` when this process has not loaded it
    (:func:`needs_loading` says so; the caller loads it or leaves the label
    alone). ``KeyError`` for a machine the configuration lacks.
    """
    in_force = config.get_machine(machine)
    if not in_force.continues or version is None or version == loaded.in_force.get(machine):
        return in_force
    return loaded.compiled.get((machine, version))


def needs_loading(
    config: Config, loaded: LoadedVersions, machine: str, version: int | None
) -> bool:
    """Whether :func:`definition_for` lacks that version's definition (a ``continue`` machine's)."""
    try:
        return definition_for(config, loaded, machine, version) is None
    except KeyError:
        return False


def version_of_label(
    config: Config, loaded: LoadedVersions, machine: str, version: int | None
) -> int | None:
    """The version a label follows, as ``GET`` shows it: its own (``continue``), else the one in
    force (``None`` when this process recorded none)."""
    try:
        continues = config.get_machine(machine).continues
    except KeyError:
        return version
    if continues and version is not None:
        return version
    return loaded.in_force.get(machine)


def compile_definition(definition: Mapping[str, Any], in_force: StateMachine) -> StateMachine:
    """A runnable machine from a stored definition (``describe_machine``'s JSON).

    Raises ``ValueError`` (a ``ConditionSyntaxError`` among them) when the
    stored definition cannot be compiled.
    """
    actions = {state.name: state for state in in_force.states if isinstance(state, Action)}
    states = tuple(_state(state, in_force, actions) for state in definition["states"])
    if not states:
        raise ValueError("a stored definition without states")
    return dataclasses.replace(
        in_force,
        states=states,
        feeds=tuple(Feed(feed["name"], feed["url"]) for feed in definition.get("feeds", [])),
    )


def _state(state: Mapping[str, Any], machine: StateMachine, actions: Mapping[str, Action]) -> State:
    next_states = _next(state["next"])
    outcome = state.get("outcome")
    if state["kind"] == "gate":
        return Gate(
            name=state["name"],
            exit_condition=compile_condition(state["exit_condition"]),
            triggers=tuple(_trigger(trigger) for trigger in state["triggers"]),
            next_states=next_states,
            outcome=outcome,
        )
    if state["kind"] == "spawn":
        spawn = state["spawn"]
        wait = spawn["wait"]
        return Spawn(
            name=state["name"],
            machine=spawn["machine"],
            for_each=tuple(spawn["for_each"].split(".")),
            next_states=next_states,
            at_least=None if wait == "all" else int(wait["at_least"]),
            on_exit_delete=spawn["on_exit"] == "delete",
            outcome=outcome,
        )
    current = actions.get(state["name"])
    worker = state.get("worker")
    webhook = state.get("webhook")
    return Action(
        name=state["name"],
        webhook=webhook,
        next_states=next_states,
        retry=current.retry if current is not None else machine.retry,
        worker=(
            PullWorker(datetime.timedelta(seconds=worker["lease"])) if worker is not None else None
        ),
        async_timeout=current.async_timeout if current is not None and webhook else None,
        # the flow in force: one flow's per-key counts span every version's labels
        flow=current.flow if current is not None else None,
        outcome=outcome,
    )


def _trigger(trigger: Mapping[str, Any]) -> Trigger:
    kind = trigger["kind"]
    if kind == "metadata":
        return MetadataTrigger(tuple(trigger["path"].split(".")))
    if kind == "interval":
        return IntervalTrigger(datetime.timedelta(seconds=trigger["seconds"]))
    if kind == "time":
        at = parse_time_of_day(trigger["time"])
        if at is None:
            raise ValueError(f"a stored time trigger without a time: {trigger['time']!r}")
        return TimeTrigger(at, _timezone(trigger["timezone"]))
    if kind == "event":
        return TimerTrigger() if trigger.get("event") == "timer" else EntryTrigger()
    raise ValueError(f"a stored trigger of an unknown kind: {kind!r}")


def _timezone(zone: str) -> Timezone:
    if zone == "system":
        return SystemTimezone()
    if zone.startswith("metadata."):
        return MetadataTimezone(tuple(zone.split(".")))
    return NamedTimezone(zone)


def _next(rule: Mapping[str, Any]) -> NextStates:
    if rule["type"] == "constant":
        return ConstantNext(rule["state"])
    if rule["type"] == "context":
        return ContextNext(
            path=tuple(rule["path"].split(".")),
            default=rule["default"],
            destinations=tuple(
                ContextNextDestination(value=destination["value"], state=destination["state"])
                for destination in rule["destinations"]
            ),
        )
    return NoNext()
