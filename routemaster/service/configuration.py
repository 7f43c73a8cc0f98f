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
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.graph import describe_machine
from routemaster.config.model import Migration, NoNext, StateMachine
from routemaster.db import config_migrations as store
from routemaster.db import counts, versions
from routemaster.db import labels as db_labels
from routemaster.db.versions import MachineVersion as MachineVersion  # for the faces
from routemaster.machine.upgrades import ConfigPlan, plan_config
from routemaster.service.errors import LabelDeleted, LabelNotFound
from routemaster.service.labels import finish_in_request
from routemaster.service.operations import force_move, move_locked
from routemaster.service.versions import MAX_VERSIONS

logger = logging.getLogger(__name__)

BATCH = 500


class LabelsStranded(Exception):
    """Labels sit in states the configuration lacks, with no migration: nothing was applied."""

    def __init__(self, plan: ConfigPlan) -> None:
        super().__init__("labels would be stranded")
        self.plan = plan


def current_plan(app: App) -> ConfigPlan:
    """The configuration against the definitions last applied and the labels there are now."""
    with app.db.connect() as conn:
        applied = {
            name: (found.version, found.definition)
            for name, found in versions.last_applied(conn).items()
        }
        per_state: dict[str, dict[str, int]] = {}
        for (machine, state), count in counts.per_state(conn).items():
            per_state.setdefault(machine, {})[state] = count
        kept = counts.per_version(conn) if applied else {}
        at_home = _labels_at_home(conn, app) if applied else {}
    return plan_config(app.config, applied, per_state, kept, at_home)


def _labels_at_home(conn: sa.Connection, app: App) -> dict[str, dict[str, int]]:
    """Per ``continue`` machine and state, the labels whose own version has that state.

    They finish under their version, so a configuration that lacks the state
    does not strand them.
    """
    continuing = {machine.name for machine in app.config.state_machines if machine.continues}
    if not continuing:
        return {}
    states = {
        (found.machine, found.version): {state["name"] for state in found.definition["states"]}
        for name in continuing
        for found in versions.versions_of(conn, name, after=0, limit=MAX_VERSIONS)
    }
    home: dict[str, dict[str, int]] = {}
    for machine, version, state, count in counts.per_version_state(conn):
        if machine in continuing and state in states.get((machine, version), ()):
            home.setdefault(machine, {})[state] = home.get(machine, {}).get(state, 0) + count
    return home


def record_configuration(app: App) -> Recorded:
    """Record each machine's definition as a version: each machine's number, and the last
    applied one's.

    Under the configuration lock. Raises :class:`LabelsStranded`, having
    recorded nothing, when labels would be stranded.
    """
    with store.config_lock(app.db, wait=True):
        plan = current_plan(app)
        if plan.strands_labels:
            raise LabelsStranded(plan)
        with app.db.begin() as conn:
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
        with app.db.connect() as conn:
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
    with app.db.begin() as conn:
        label = db_labels.lock(conn, machine.name, name)
        if label is None or label.deleted or label.version != old:
            return 0
        versions.set_label_version(conn, machine.name, name, new, now=now)
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
                with app.db.begin() as conn:
                    found = done = store.rename_batch(
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
                with app.db.connect() as conn:
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


def versions_of(app: App, machine: str, *, after: int, limit: int) -> list[MachineVersion]:
    """The machine's versions numbered above ``after``, oldest first, at most ``limit``."""
    with app.db.connect() as conn:
        return versions.versions_of(conn, machine, after=after, limit=limit)
