"""Where the changes stream stands, and reads made in one snapshot of it.

A page that shows counts or a label reads them in one snapshot (``REPEATABLE
READ``) and tells its script that snapshot, so the script applies exactly the
changes the page does not show yet (see :class:`~routemaster.db.changes.Snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.db import changes, counts
from routemaster.db import labels as store
from routemaster.db.changes import Change, Position, Snapshot
from routemaster.db.counts import StateCount
from routemaster.db.labels import HistoryEntry, Label
from routemaster.db.listings import label_page
from routemaster.machine.upgrades import labels_by_version
from routemaster.service.transactions import one_snapshot, read

__all__ = [
    "Change",
    "MachineOverview",
    "Position",
    "Snapshot",
    "label_and_history",
    "machine_overview",
    "machines_counted",
    "present",
]


present = read(changes.present)
"""Where a stream started now begins: after every change committed so far."""


def machines_counted(app: App) -> tuple[Snapshot, list[tuple[StateMachine, dict[str, StateCount]]]]:
    """Every machine with its label counts per state, in one snapshot."""
    machines = []
    with one_snapshot(app) as conn:
        seen = changes.snapshot(conn)
        for machine in app.config.state_machines:
            machines.append((machine, counts.in_machine(conn, machine.name)))
    return seen, machines


@dataclass(frozen=True)
class MachineOverview:
    """What a machine's page shows, read in one snapshot."""

    snapshot: Snapshot
    counts: dict[str, StateCount]
    recent: list[Change]  # the latest changes, newest first
    errored: list[tuple[str, str]]  # errored labels by name, (name, state)
    # live labels by the machine version they follow, oldest first (SPEC E4)
    versions_in_use: tuple[tuple[int | None, int], ...] = ()


def machine_overview(
    app: App, machine: StateMachine, *, recent: int, errored: int
) -> MachineOverview:
    """Counts per state, the latest ``recent`` changes and the first ``errored`` errored labels."""
    with one_snapshot(app) as conn:
        per_state = counts.in_machine(conn, machine.name)
        in_force = app.versions.in_force.get(machine.name)
        # The labels on the version in force are the rest: only the others are read.
        kept = counts.versions_beside(conn, machine.name, in_force) if machine.continues else {}
        return MachineOverview(
            snapshot=changes.snapshot(conn),
            counts=per_state,
            recent=changes.recent_changes(conn, machine.name, limit=recent),
            errored=label_page(conn, machine.name, after="", limit=errored, errored=True),
            versions_in_use=labels_by_version(
                in_force, sum(count.labels for count in per_state.values()), kept
            ),
        )


def label_and_history(
    app: App, machine: StateMachine, name: str
) -> tuple[Snapshot, Label | None, list[HistoryEntry]]:
    """The label (deleted ones too; ``None`` if never created) and its history, in one snapshot."""
    with one_snapshot(app) as conn:
        seen = changes.snapshot(conn)
        found = store.get(conn, machine.name, name)
        history = store.history(conn, machine.name, name) if found else []
    return seen, found, history
