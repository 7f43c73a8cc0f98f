"""What a configuration changes against the one last applied, and which labels it would strand.

Pure: the last applied definitions (JSON, as the API describes a machine),
the new configuration and the label counts per state come in; a plan comes
out, shown by ``routemaster plan``, checked by ``serve``, ``cron`` and
``migrate`` before they start, and by ``validate``.

A label is *stranded* when it sits in a state the new configuration lacks
and no migration names that state: no process running the new
configuration would ever move it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from routemaster.config.graph import describe_machine
from routemaster.config.model import Config, Migration, StateMachine

Definition = Mapping[str, Any]
"""A machine as ``describe_machine`` (and ``GET /state-machines/{sm}``) shows it."""

_COMPARED_AS_IDENTITY = frozenset({"name", "end"})  # "end" follows from "next"


@dataclass(frozen=True)
class StateChange:
    """One state of a machine and what the new configuration does to it.

    ``change``: ``added``, ``removed``, ``renamed`` or ``moved`` (to
    ``to``), ``changed`` (``aspects`` says what: exit_condition, triggers,
    webhook, next, ...) or ``unchanged``.
    """

    name: str
    change: str
    labels: int | None = 0  # None: the state holds labels, not counted (it does not change)
    to: str | None = None
    aspects: tuple[str, ...] = ()


@dataclass(frozen=True)
class MachinePlan:
    name: str
    status: str  # "new" (never applied), "changed", "unchanged", "removed" (not configured)
    applied_version: int | None
    states: tuple[StateChange, ...]
    stranded: tuple[tuple[str, int], ...] = ()  # (state, labels)
    feeds_changed: bool = False
    # a ``continue`` machine's live labels by the version they follow, oldest first: (version,
    # labels); those on the last applied version (or keeping none) by :func:`labels_by_version`
    versions: tuple[tuple[int | None, int], ...] = ()


@dataclass(frozen=True)
class ConfigPlan:
    machines: tuple[MachinePlan, ...]
    stranded: tuple[tuple[str, str, int], ...] = field(default=())  # (machine, state, labels)

    @property
    def strands_labels(self) -> bool:
        return bool(self.stranded)


def plan_config(
    config: Config,
    applied: Mapping[str, tuple[int, Definition]],
    counts: Mapping[str, Mapping[str, int | None]],
    version_counts: Mapping[str, Mapping[int, int]] | None = None,
    at_home: Mapping[str, Mapping[str, int]] | None = None,
    totals: Mapping[str, int] | None = None,
) -> ConfigPlan:
    """The plan of ``config`` against ``applied`` (machine -> (version, definition)).

    ``counts``: live labels per machine and state, as the database holds them now (``None``:
    the state holds labels that were not counted); ``version_counts``: a ``continue``
    machine's live labels per version they keep, other than the last applied one;
    ``at_home``: per machine and state, labels whose own version has that state (they are
    never stranded: a ``continue`` machine's labels finish under their version);
    ``totals``: a ``continue`` machine's live labels, all versions together (the last
    applied version's are these less ``version_counts``', by :func:`labels_by_version`).
    """
    version_counts = version_counts or {}
    at_home = at_home or {}
    totals = totals or {}
    machines = [
        dataclasses.replace(
            _unstrand(
                plan_machine(machine, applied.get(machine.name), counts.get(machine.name, {})),
                at_home.get(machine.name, {}) if machine.continues else {},
            ),
            versions=labels_by_version(
                applied[machine.name][0],
                totals.get(machine.name, 0),
                version_counts.get(machine.name, {}),
            )
            if machine.continues and machine.name in applied
            else (),
        )
        for machine in config.state_machines
    ]
    configured = {machine.name for machine in config.state_machines}
    for name in sorted((set(applied) | set(counts)) - configured):
        machines.append(_removed_machine(name, applied.get(name), counts.get(name, {})))
    stranded = tuple(
        (plan.name, state, labels) for plan in machines for state, labels in plan.stranded
    )
    return ConfigPlan(tuple(machines), stranded)


def _unstrand(plan: MachinePlan, at_home: Mapping[str, int]) -> MachinePlan:
    """``plan`` without the labels that finish under their own version (``at_home``)."""
    if not at_home:
        return plan
    stranded = tuple(
        (state, labels - at_home.get(state, 0))
        for state, labels in plan.stranded
        if labels > at_home.get(state, 0)
    )
    return dataclasses.replace(plan, stranded=stranded)


def labels_by_version(
    applied: int | None, total: int, kept: Mapping[int, int]
) -> tuple[tuple[int | None, int], ...]:
    """``total`` live labels by the version they follow: those that keep one (``kept``) by
    theirs, the others by the definition in force (``applied``). Versions with no label are
    left out. The machine page's figures and ``/metrics``' ``routemaster_labels_by_version``."""
    by_version: dict[int | None, int] = {version: labels for version, labels in kept.items()}
    rest = total - sum(kept.values())
    if rest > 0:
        by_version[applied] = by_version.get(applied, 0) + rest
    return tuple(
        sorted(
            ((version, labels) for version, labels in by_version.items() if labels),
            key=lambda pair: -1 if pair[0] is None else pair[0],
        )
    )


def plan_machine(
    machine: StateMachine,
    applied: tuple[int, Definition] | None,
    counts: Mapping[str, int | None],
) -> MachinePlan:
    """One configured machine against its last applied definition (``None``: never applied)."""
    return compare_definitions(
        describe_machine(machine),
        applied[1] if applied else None,
        machine.migrations,
        counts,
        applied_version=applied[0] if applied else None,
    )


def compare_definitions(
    new: Definition,
    old: Definition | None,
    migrations: Sequence[Migration] = (),
    counts: Mapping[str, int | None] | None = None,
    *,
    applied_version: int | None = None,
) -> MachinePlan:
    """What changes from definition ``old`` to ``new`` (the console compares two versions)."""
    counts = counts or {}
    new_states = {state["name"]: state for state in new["states"]}
    old_states = {state["name"]: state for state in old["states"]} if old else {}
    by_source = {migration.from_state: migration for migration in migrations}
    renamed_to = {
        migration.to_state
        for migration in migrations
        if migration.kind == "rename" and migration.from_state in old_states
    }
    changes: list[StateChange] = []
    for name, state in new_states.items():
        labels = counts.get(name, 0)
        if name not in old_states:
            if old is None:
                changes.append(StateChange(name, "unchanged", labels))
            elif name not in renamed_to:
                changes.append(StateChange(name, "added", labels))
            continue
        aspects = _differences(old_states[name], state)
        changes.append(
            StateChange(name, "changed" if aspects else "unchanged", labels, None, aspects)
        )
    gone = [name for name in old_states if name not in new_states]
    gone += sorted(name for name in counts if name not in new_states and name not in old_states)
    stranded: list[tuple[str, int]] = []
    for name in gone:
        labels = counts.get(name, 0)
        migration = by_source.get(name)
        if migration is not None:
            change = "renamed" if migration.kind == "rename" else "moved"
            changes.append(StateChange(name, change, labels, migration.to_state))
            continue
        changes.append(StateChange(name, "removed", labels))
        if labels:  # a state the configuration lacks is always counted
            stranded.append((name, labels))
    return MachinePlan(
        name=str(new["name"]),
        status="new" if old is None else _status(changes, old, new),
        applied_version=applied_version,
        states=tuple(changes),
        stranded=tuple(stranded),
        feeds_changed=old is not None and old.get("feeds") != new.get("feeds"),
    )


def _removed_machine(
    name: str, applied: tuple[int, Definition] | None, counts: Mapping[str, int | None]
) -> MachinePlan:
    old_states = [state["name"] for state in applied[1]["states"]] if applied else []
    names = old_states + sorted(state for state in counts if state not in old_states)
    states = tuple(StateChange(state, "removed", counts.get(state, 0)) for state in names)
    return MachinePlan(
        name=name,
        status="removed",
        applied_version=applied[0] if applied else None,
        states=states,
        stranded=tuple((state.name, state.labels) for state in states if state.labels),
    )


def _differences(old: Definition, new: Definition) -> tuple[str, ...]:
    keys = (set(old) | set(new)) - _COMPARED_AS_IDENTITY
    ordered = [key for key in new if key in keys] + sorted(keys - set(new))
    return tuple(key for key in ordered if old.get(key) != new.get(key))


def _status(changes: list[StateChange], old: Definition, new: Definition) -> str:
    if any(change.change != "unchanged" for change in changes):
        return "changed"
    if [state["name"] for state in old["states"]] != [state["name"] for state in new["states"]]:
        return "changed"  # the same states in another order: the first state may differ
    return "changed" if old.get("feeds") != new.get("feeds") else "unchanged"


def stranded_message(plan: ConfigPlan) -> str:
    """The one message ``plan``, ``serve``, ``cron`` and ``migrate`` give for stranded labels."""
    listed = ", ".join(
        f"{machine}.{state} ({labels} label{'s' if labels != 1 else ''})"
        for machine, state, labels in plan.stranded
    )
    return (
        f"Labels would be stranded in states the configuration no longer has: {listed}. "
        "Add a migration for each state (migrations: - rename: {from: OLD, to: NEW} or "
        "- move: {from: OLD, to: STATE}), or move those labels first; "
        "see `routemaster -c CONFIG plan`."
    )


def plan_as_json(plan: ConfigPlan) -> dict[str, Any]:
    return {
        "state_machines": [
            {
                "name": machine.name,
                "status": machine.status,
                "applied_version": machine.applied_version,
                "feeds_changed": machine.feeds_changed,
                "states": [
                    {
                        "name": state.name,
                        "change": state.change,
                        "labels": state.labels,
                        **({"to": state.to} if state.to else {}),
                        **({"aspects": list(state.aspects)} if state.aspects else {}),
                    }
                    for state in machine.states
                ],
                "stranded": [
                    {"state": state, "labels": labels} for state, labels in machine.stranded
                ],
                "versions": [
                    {"version": version, "labels": labels} for version, labels in machine.versions
                ],
            }
            for machine in plan.machines
        ],
        "stranded": [
            {"state_machine": machine, "state": state, "labels": labels}
            for machine, state, labels in plan.stranded
        ],
    }


def plan_as_text(plan: ConfigPlan) -> list[str]:
    """The plan for people: one line per machine, then one per state that changes."""
    lines: list[str] = []
    for machine in plan.machines:
        applied = (
            f"against version {machine.applied_version}"
            if machine.applied_version is not None
            else "never applied"
        )
        lines.append(f"{machine.name}: {machine.status} ({applied})")
        if machine.feeds_changed:
            lines.append("  feeds changed")
        if machine.versions:
            listed = ", ".join(f"{version}: {labels}" for version, labels in machine.versions)
            lines.append(f"  labels by version: {listed}")
        for state in machine.states:
            if state.change == "unchanged" and machine.status != "new":
                continue
            count = (
                "labels not counted"
                if state.labels is None
                else f"{state.labels} label{'s' if state.labels != 1 else ''}"
            )
            detail = f" -> {state.to}" if state.to else ""
            if state.aspects:
                detail = f" ({', '.join(state.aspects)})"
            stranded = " STRANDED" if state.name in dict(machine.stranded) else ""
            lines.append(f"  {state.change} {state.name}{detail}: {count}{stranded}")
    return lines
