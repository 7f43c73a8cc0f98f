"""The definition that governs a label, with older versions loaded from the store as needed.

:func:`routemaster.machine.definitions.definition_for` is the one rule, pure
given the versions a process has loaded (``app.versions``); this module is
its I/O half: it loads a ``continue`` machine's versions from
``machine_versions`` and compiles each once per process (versions never
change once recorded), so a process also runs labels created under a version
newer than its own (a rolling deploy) by that version's definition.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from routemaster.app import App
from routemaster.config.model import Config, Gate, IntervalTrigger, StateMachine, TimeTrigger
from routemaster.db import versions as store
from routemaster.db.labels import Label
from routemaster.machine.clock import ScheduledTrigger, scheduled_triggers
from routemaster.machine.definitions import (
    LoadedVersions,
    VersionKey,
    compile_definition,
    definition_for,
    needs_loading,
)
from routemaster.service.transactions import reading

logger = logging.getLogger(__name__)

MAX_VERSIONS = 10_000
"""The most versions of one machine read at start (far more than any machine has)."""


def machine_for(app: App, label: Label) -> StateMachine | None:
    """The definition that governs ``label``; ``None`` when its version cannot be found.

    ``KeyError`` for a machine the configuration lacks.
    """
    return governing(app, label.state_machine, label.version)


def governing(app: App, machine: str, version: int | None) -> StateMachine | None:
    """:func:`definition_for`, loading that version from the store the first time."""
    if needs_loading(app.config, app.versions, machine, version):
        assert version is not None
        load_versions(app, [(machine, version)])
    return definition_for(app.config, app.versions, machine, version)


def load_versions(app: App, keys: Iterable[VersionKey]) -> None:
    """Compile the given versions of ``continue`` machines into ``app.versions``."""
    wanted = [key for key in keys if key not in app.versions.compiled]
    if not wanted:
        return
    with reading(app) as conn:
        found = [store.version_of(conn, machine, version) for machine, version in wanted]
    _remember(app, [row for row in found if row is not None])


def load_all_versions(app: App) -> LoadedVersions:
    """Every recorded version of the ``continue`` machines, compiled (at a process's start)."""
    continuing = [machine.name for machine in app.config.state_machines if machine.continues]
    if continuing:
        with reading(app) as conn:
            rows = [
                row
                for name in continuing
                for row in store.versions_of(conn, name, after=0, limit=MAX_VERSIONS)
            ]
        _remember(app, rows)
    return app.versions


def _remember(app: App, rows: list[store.MachineVersion]) -> None:
    compiled: dict[VersionKey, StateMachine] = {}
    for row in rows:
        if row.version == app.versions.in_force.get(row.machine):
            continue
        try:
            in_force = app.config.get_machine(row.machine)
            compiled[(row.machine, row.version)] = compile_definition(row.definition, in_force)
        except (KeyError, ValueError, TypeError):
            logger.exception("version %d of %s cannot be compiled", row.version, row.machine)
    if compiled:
        app.versions = app.versions.with_compiled(compiled)


def definitions_of(app: App, machine: StateMachine) -> list[StateMachine]:
    """The definitions a worker claims labels for: the one in force, then older loaded ones."""
    older = [
        definition
        for (name, _), definition in sorted(app.versions.compiled.items(), key=lambda kv: kv[0])
        if name == machine.name
    ]
    return [machine, *older] if machine.continues else [machine]


def worker_view(app: App) -> Config:
    """The configuration with, per ``continue`` machine, the states only older versions have.

    What a worker claims and schedules from: labels of older versions may sit
    in states the configuration no longer has, and must still be delivered
    and evaluated (each by its own version's definition, :func:`machine_for`).
    A state both have is the configuration's here (its receiver, its clock
    triggers).
    """
    machines = []
    for machine in app.config.state_machines:
        states = list(machine.states)
        names = {state.name for state in states}
        for older in definitions_of(app, machine)[1:]:
            for state in older.states:
                if state.name not in names:
                    names.add(state.name)
                    states.append(state)
        machines.append(dataclasses.replace(machine, states=tuple(states)))
    return dataclasses.replace(app.config, state_machines=tuple(machines))


def worker_triggers(app: App) -> list[ScheduledTrigger]:
    """The clock triggers a worker fires: the configuration's, then older versions' own.

    A label of a ``continue`` machine falls due at its own version's gate's
    occurrences (:mod:`routemaster.service.scheduling`), so that gate's clock
    triggers fire too (1.x's ``process_cron`` per occurrence), keyed by version
    (``machine/state/index@vN``); a trigger the configuration's gate of the
    same name already has fires once, as the configuration's.
    """
    found = list(scheduled_triggers(app.config))
    seen = {(s.machine.name, s.state, s.trigger) for s in found}
    for machine in app.config.state_machines:
        if not machine.continues:
            continue
        for (name, version), older in sorted(app.versions.compiled.items(), key=lambda kv: kv[0]):
            if name != machine.name:
                continue
            for state in older.states:
                if not isinstance(state, Gate):
                    continue
                for index, trigger in enumerate(state.triggers):
                    if not isinstance(trigger, IntervalTrigger | TimeTrigger):
                        continue
                    if (name, state.name, trigger) in seen:
                        continue
                    seen.add((name, state.name, trigger))
                    found.append(ScheduledTrigger(older, state.name, index, trigger, version))
    return found
