"""Applying a configuration: the versions it starts, and its ``migrations:`` on the live labels.

:func:`record_configuration` and :func:`apply_migrations` are what
``serve``, ``cron`` and ``migrate -c`` do before anything else, under the
configuration lock: refuse when labels would be stranded, record each
machine's definition as a version, apply the migrations. Workers call
:func:`apply_migrations` again now and then, so labels that a process still
running the previous configuration put into a migrated state (a rolling
deploy) follow too.

Migrations apply by effect: whatever label sits in a ``from`` state now is
migrated, in batches; a label migrated already is in no ``from`` state, so
applying them again changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.graph import describe_machine
from routemaster.config.model import Migration, NoNext, StateMachine
from routemaster.db import config_migrations as store
from routemaster.db import label_counts, occupied_states, transitions, versions
from routemaster.db import labels as db_labels
from routemaster.db.versions import MachineVersion as MachineVersion  # for the faces
from routemaster.machine.upgrades import ConfigPlan, plan_config, plan_machine
from routemaster.service.labels import finish_in_request
from routemaster.service.operations import force_move, move_locked
from routemaster.service.refusals import LabelDeleted, LabelNotFound
from routemaster.service.transactions import read, reading, writing
from routemaster.service.versions import MAX_VERSIONS

logger = logging.getLogger(__name__)

BATCH = 500


class LabelsStranded(Exception):
    """Labels sit in states the configuration lacks, with no migration: nothing was applied."""

    def __init__(self, plan: ConfigPlan) -> None:
        super().__init__("labels would be stranded")
        self.plan = plan


def current_plan(app: App) -> ConfigPlan:
    """What ``routemaster plan`` shows: the configuration against the definitions last applied.

    Labels are counted only in the states that matter: those the plan shows
    as changing (added, removed, renamed, moved, changed) and every state of
    a machine never applied or no longer configured. An unchanged state that
    holds labels is shown without a count (``None``). ``versions``: a
    ``continue`` machine's labels per version they follow: those on other
    versions than the last applied one read by their index, the last applied
    one's the machine's kept total less them. Which states hold labels comes
    from an index, one probe per state, so the cost follows the states that
    change, not the labels stored.
    """
    return _plan(app, _changing_states, older_versions=True)


def stranding_plan(app: App) -> ConfigPlan:
    """The start-up check's plan: labels counted only in states the configuration lacks and
    no migration takes labels out of (the states that would strand them)."""
    return _plan(app, _missing_states, older_versions=False)


Applied = tuple[int, dict[str, Any]]
"""A machine's last applied version and definition."""

StatesToCount = Callable[[StateMachine | None, Applied | None, list[str]], list[str]]
"""Of one machine's states that hold labels, those to count (the configured machine, or
``None`` when it is no longer configured; its last applied definition, if any)."""


def _plan(app: App, which: StatesToCount, *, older_versions: bool) -> ConfigPlan:
    configured = {machine.name: machine for machine in app.config.state_machines}
    with reading(app) as conn:
        applied: dict[str, Applied] = {
            name: (found.version, found.definition)
            for name, found in versions.last_applied(conn).items()
        }
        held = occupied_states.occupied(conn)
        counts: dict[str, dict[str, int | None]] = {}
        by_version: dict[tuple[str, str], dict[int | None, int]] = {}
        for name, states in held.items():
            counted = which(configured.get(name), applied.get(name), states)
            counts[name] = dict.fromkeys(states)
            for state in counted:
                by_version[name, state] = occupied_states.in_state(conn, name, state)
                counts[name][state] = sum(by_version[name, state].values())
        continuing = [
            name
            for name, machine in configured.items()
            if older_versions and machine.continues and name in applied
        ]
        older = {
            name: occupied_states.other_versions(conn, name, applied[name][0])
            for name in continuing
        }
        totals = {name: _live_labels(conn, name, held.get(name, [])) for name in continuing}
        at_home = _labels_at_home(conn, app, by_version) if applied else {}
    return plan_config(app.config, applied, counts, older, at_home, totals)


def _live_labels(conn: sa.Connection, machine: str, states: list[str]) -> int:
    """One machine's live labels: the kept counts, or (``plan`` before ``migrate`` has kept
    any) a count of each state that holds labels."""
    kept = label_counts.kept_in_machine(conn, machine) if label_counts.has_table(conn) else None
    if kept is None:
        return sum(sum(occupied_states.in_state(conn, machine, s).values()) for s in states)
    return sum(kept.values())


def _changing_states(
    machine: StateMachine | None, applied: Applied | None, states: list[str]
) -> list[str]:
    """All of a machine never applied or not configured; else those whose change shows."""
    if machine is None or applied is None:
        return states
    changes = plan_machine(machine, applied, dict.fromkeys(states, 0)).states
    changing = {change.name for change in changes if change.change != "unchanged"}
    return [state for state in states if state in changing]


def _missing_states(
    machine: StateMachine | None, applied: Applied | None, states: list[str]
) -> list[str]:
    """The states the configuration lacks and no migration names (all of a machine gone)."""
    if machine is None:
        return states
    kept = {state.name for state in machine.states}
    kept |= {migration.from_state for migration in machine.migrations}
    return [state for state in states if state not in kept]


def _labels_at_home(
    conn: sa.Connection, app: App, counted: dict[tuple[str, str], dict[int | None, int]]
) -> dict[str, dict[str, int]]:
    """Per ``continue`` machine and counted state, the labels whose own version has that state.

    They finish under their version, so a configuration that lacks the state
    does not strand them.
    """
    continuing = {machine.name for machine in app.config.state_machines if machine.continues}
    wanted = {machine for machine, _ in counted if machine in continuing}
    if not wanted:
        return {}
    states = {
        (found.machine, found.version): {state["name"] for state in found.definition["states"]}
        for name in wanted
        for found in versions.versions_of(conn, name, after=0, limit=MAX_VERSIONS)
    }
    home: dict[str, dict[str, int]] = {}
    for (machine, state), per_version in counted.items():
        if machine not in wanted:
            continue
        for version, count in per_version.items():
            if state in states.get((machine, version), ()):  # type: ignore[arg-type]
                home.setdefault(machine, {})[state] = home.get(machine, {}).get(state, 0) + count
    return home


def record_configuration(app: App) -> Recorded:
    """Record each machine's definition as a version: each machine's number, and the last
    applied one's.

    Under the configuration lock. Raises :class:`LabelsStranded`, having
    recorded nothing, when labels would be stranded.
    """
    with store.config_lock(app.db, wait=True):
        plan = stranding_plan(app)
        if plan.strands_labels:
            raise LabelsStranded(plan)
        with writing(app) as conn:
            recorded = {
                machine.name: versions.record_version(conn, machine.name, describe_machine(machine))
                for machine in app.config.state_machines
            }
        previous = {machine.name: machine.applied_version for machine in plan.machines}
        return Recorded(recorded, previous)


@dataclass(frozen=True)
class Recorded:
    """The version of each machine a configuration runs, and the one applied before it."""

    versions: dict[str, int]
    previous: dict[str, int | None]


def abort_older_labels(app: App, recorded: Recorded, *, batch: int = BATCH) -> int:
    """``upgrade_strategy: abort``: move older versions' labels to ``abort_to``; how many.

    Every live label created under a version before the one in force, not in
    an end state, is moved there by force with reason ``aborted: version OLD
    -> NEW`` and put on the new version. Labels with no version (created while
    the machine was ``upgrade``) are taken too when the version in force is
    new. Under the configuration lock, in batches; a label leased by a worker
    (a delivery in flight) waits for the next start.
    """
    aborted = 0
    with store.config_lock(app.db, wait=True):
        for machine in app.config.state_machines:
            if machine.upgrade_strategy == "abort" and machine.abort_to is not None:
                aborted += _abort_machine(app, machine, machine.abort_to, recorded, batch)
    return aborted


def _abort_machine(app: App, machine: StateMachine, to: str, recorded: Recorded, batch: int) -> int:
    new = recorded.versions[machine.name]
    previous = recorded.previous.get(machine.name)
    ends = [state.name for state in machine.states if isinstance(state.next_states, NoNext)]
    aborted = 0
    while True:
        with reading(app) as conn:
            found = versions.labels_to_abort(
                conn,
                machine.name,
                version=new,
                ends=ends,
                unversioned=previous != new,
                now=app.now(),
                limit=batch,
            )
        done = sum(_abort(app, machine, name, old, previous, new, to) for name, old in found)
        aborted += done
        if len(found) < batch or not done:
            break
    if aborted:
        logger.info("%s: %d labels of older versions aborted to %s", machine.name, aborted, to)
    return aborted


def _abort(
    app: App,
    machine: StateMachine,
    name: str,
    old: int | None,
    previous: int | None,
    new: int,
    to: str,
) -> int:
    """Move one label to ``to`` and onto version ``new``, if it still qualifies."""
    shown = old if old is not None else previous
    reason = f"aborted: version {shown if shown is not None else 'none'} -> {new}"
    now = app.now()
    with writing(app) as conn:
        label = db_labels.lock(conn, machine.name, name)
        if label is None or label.deleted or label.version != old:
            return 0
        transitions.set_version(conn, machine.name, name, new, now=now)
        label, plan = move_locked(conn, app, machine, label, to, now=now, reason=reason)
    if plan is not None:
        finish_in_request(app, machine, label, plan)
    return 1


def apply_migrations(app: App, *, wait: bool, batch: int = BATCH) -> int:
    """Migrate every label found in a ``from`` state; how many were migrated.

    Under the configuration lock; with ``wait=False`` nothing is done when
    another process holds it (it is applying them).
    """
    with store.config_lock(app.db, wait=wait) as held:
        if not held:
            return 0
        return sum(_migrate_machine(app, machine, batch) for machine in app.config.state_machines)


def _migrate_machine(app: App, machine: StateMachine, batch: int) -> int:
    # A continue machine's older labels keep their states (they reach the version in force
    # only through a bulk upgrade): only those following the version in force migrate.
    version = app.versions.in_force.get(machine.name) if machine.continues else None
    migrated = 0
    for migration in machine.migrations:
        while True:
            if migration.kind == "rename":
                with writing(app) as conn:
                    found = done = transitions.rename_batch(
                        conn,
                        machine.name,
                        migration.from_state,
                        migration.to_state,
                        reason=migration.reason,
                        now=app.now(),
                        limit=batch,
                        version=version,
                    )
            else:
                with reading(app) as conn:
                    names = store.names_in_state(
                        conn,
                        machine.name,
                        migration.from_state,
                        now=app.now(),
                        limit=batch,
                        version=version,
                    )
                found = len(names)
                done = sum(_move(app, machine, name, migration) for name in names)
            migrated += done
            if done:
                logger.info("%s: %d labels migrated (%s)", machine.name, done, migration.reason)
                if app.metrics is not None:
                    app.metrics.migrated.labels(
                        machine.name, migration.kind, migration.from_state, migration.to_state
                    ).inc(done)
            if found < batch or not done:
                break
    return migrated


def _move(app: App, machine: StateMachine, name: str, migration: Migration) -> int:
    """Move one label as a forced move does, if it is still in the migrated state."""
    try:
        force_move(
            app,
            machine,
            name,
            migration.to_state,
            reason=migration.reason,
            only_from=migration.from_state,
        )
    except (LabelNotFound, LabelDeleted):
        return 0
    return 1


versions_of = read(versions.versions_of)
"""The machine's versions numbered above ``after``, oldest first, at most ``limit``."""
