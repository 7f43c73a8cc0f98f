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

from routemaster.app import App
from routemaster.config.graph import describe_machine
from routemaster.config.model import Migration, StateMachine
from routemaster.db import config_migrations as store
from routemaster.db import versions
from routemaster.db.versions import MachineVersion as MachineVersion  # for the faces
from routemaster.machine.upgrades import ConfigPlan, plan_config
from routemaster.service.errors import LabelDeleted, LabelNotFound
from routemaster.service.operations import force_move

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
        counts = versions.label_counts(conn)
    return plan_config(app.config, applied, counts)


def record_configuration(app: App) -> dict[str, int]:
    """Record each machine's definition as a version; machine -> its version number.

    Under the configuration lock. Raises :class:`LabelsStranded`, having
    recorded nothing, when labels would be stranded.
    """
    with store.config_lock(app.db, wait=True):
        plan = current_plan(app)
        if plan.strands_labels:
            raise LabelsStranded(plan)
        with app.db.begin() as conn:
            return {
                machine.name: versions.record_version(conn, machine.name, describe_machine(machine))
                for machine in app.config.state_machines
            }


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
                    )
            else:
                with app.db.connect() as conn:
                    names = store.names_in_state(
                        conn, machine.name, migration.from_state, now=app.now(), limit=batch
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
