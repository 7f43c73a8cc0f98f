"""Each waiting label's next check and due time, kept by every write that can change them.

SPEC E1: the rows themselves say when the worker must next look at a label
waiting in a gate evaluated at moments (interval, daily time, ``event:
timer``), so an occurrence costs only the labels whose time has come. The
moment is computed (:mod:`routemaster.machine.schedule`) when a label enters
a gate, after every metadata update, and after every evaluation that leaves
it where it is, in the transaction that writes the change; rows written by
something that did not compute it (an older release during a rolling deploy,
a renaming migration, every row at the upgrade) are found through an index
and computed by :func:`schedule_unscheduled`, from ``migrate -c`` and the
workers, in bounded batches.

A label of a ``continue`` machine (SPEC E4) is scheduled by the gate of its
own version (its condition and triggers): every function here given a label
solves it from the definition that governs it
(:func:`routemaster.service.versions.machine_for`), whichever definition the
caller holds; one given only a state (:func:`arrival`) trusts the caller's.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Action, Gate, Spawn, State, StateMachine
from routemaster.db import label_claims, schedules, table_statistics
from routemaster.db.labels import Label
from routemaster.db.schedules import Schedule
from routemaster.exit_conditions.next_check import NextCheck
from routemaster.machine.planning import PlanInput
from routemaster.machine.schedule import (
    GateSchedule,
    after_evaluation,
    is_scheduled,
    next_check,
    schedule_gate,
)
from routemaster.service.transactions import read, reading, writing
from routemaster.service.versions import definitions_of, machine_for, worker_view

Arrival = tuple[datetime.datetime | None, datetime.datetime | None]
"""(due time, next check) of a label entering a state."""


def arrival(
    app: App,
    machine: StateMachine,
    name: str,
    metadata: Mapping[str, Any],
    *,
    state: str,
    previous_state: str | None,
    now: datetime.datetime,
) -> Arrival:
    """When the worker first looks at label ``name`` entering ``state`` at ``now``.

    ``machine``: the definition that governs the label (its own version's, on a
    ``continue`` machine). An action: at once. A gate evaluated at moments: its schedule from now
    on. Any other gate: never by itself (only updates evaluate it).
    """
    entered = machine.get_state(state)
    if isinstance(entered, Action | Spawn):
        return now, None  # a spawn: the worker spawns the children at once
    if not is_scheduled(entered):
        return None, None
    assert isinstance(entered, Gate)
    plan_input = PlanInput(name, state, metadata, now, previous_state)
    planned = schedule_gate(entered, plan_input, after=now, system_zone=app.system_zone)
    return planned.due_at, planned.next_check_at


def after_update(app: App, machine: StateMachine, label: Label) -> Schedule | None:
    """A label whose metadata changed and that stays where it is: its new schedule.

    ``None`` when its state is not a gate evaluated at moments (nothing to keep).
    """
    planned = _schedule(app, machine, label, after=app.now())
    if planned is None:
        return None
    return Schedule(label.key, label.entry_id, planned.next_check_at, planned.due_at)


def after_evaluation_of(
    app: App, machine: StateMachine, label: Label, evaluated_at: datetime.datetime
) -> Schedule:
    """An evaluated label that did not move: evaluated next at its next check from now on.

    A gate evaluated only on updates gets nothing due, as before.
    """
    planned = _schedule(
        app,
        machine,
        label,
        after=after_evaluation(evaluated_at),
        retry_at=evaluated_at + app.settings.evaluation_retry_delay,
    )
    if planned is None:
        return Schedule(label.key, label.entry_id, None, None)
    return Schedule(label.key, label.entry_id, planned.next_check_at, planned.due_at)


def scheduled_states(machine: StateMachine) -> list[str]:
    """The machine's gates evaluated at moments: their labels' updates are rescheduled."""
    return [state.name for state in machine.states if is_scheduled(state)]


def scheduled_states_of_versions(app: App, machine: StateMachine) -> list[str]:
    """:func:`scheduled_states` in any version a label of ``machine`` may follow here.

    Those of the configuration, then, on a ``continue`` machine, those only
    older versions (loaded by this process) have or evaluate at moments.
    """
    found: dict[str, None] = {}
    for definition in definitions_of(app, machine):
        found.update(dict.fromkeys(scheduled_states(definition)))
    return list(found)


def explain_next_check(app: App, machine: StateMachine, label: Label) -> NextCheck | None:
    """For ``explain`` and the console: the next check as stored, and the clause that set it.

    ``None`` when the label is not waiting in a gate. The clause comes from
    solving the condition again from the stored moment (or from now when
    none is stored), with the metadata the label has now, by the gate of the
    label's own version.
    """
    state = _state(_governing(app, machine, label), label.state)
    if not isinstance(state, Gate) or label.deleted:
        return None
    with reading(app) as conn:
        stored = schedules.next_check_of(conn, label.key)
    if stored is None:  # none yet, none possible, or a gate evaluated only on updates
        return next_check(state, plan_input_of(label), after=app.now())
    return NextCheck(stored, next_check(state, plan_input_of(label), after=stored).reason)


def next_moves(
    app: App, machine: StateMachine, *, limit: int
) -> list[tuple[str, list[schedules.NextMove]]]:
    """Per gate evaluated at moments, the labels the worker evaluates soonest: the console.

    On a ``continue`` machine, the gates of older versions' labels too.
    """
    gates = scheduled_states_of_versions(app, machine)
    with reading(app) as conn:
        return [
            (gate, schedules.next_moves(conn, machine.name, gate, limit=limit)) for gate in gates
        ]


def schedule_unscheduled(app: App, *, limit: int) -> int:
    """Compute the schedule of up to ``limit`` rows written without one; how many.

    Only states this configuration knows are taken, with the states of the
    older versions a ``continue`` machine's labels follow (a newer
    configuration's state is left to the processes running it). A due time
    already owed (an older process marked the label due) is kept if it is sooner.
    A backlog of such rows (written by SQL, or left by an upgrade) leaves the
    planner's statistics untrue as it is worked off: they are gathered again
    when they are (:mod:`routemaster.db.table_statistics`).
    """
    states = [
        (machine.name, state.name)
        for machine in worker_view(app).state_machines
        for state in machine.states
    ]
    with writing(app) as conn:
        rows = label_claims.lock_unscheduled(conn, states, limit=limit)
        schedules.schedule(conn, [_backfilled(app, label) for label in rows], now=app.now())
    if rows:
        table_statistics.refresh(app.db, {"labels": len(rows)}, direct=app.direct)
    return len(rows)


count_unscheduled = read(schedules.count_unscheduled)


def store_after_update(conn: sa.Connection, app: App, machine: StateMachine, label: Label) -> None:
    """Keep the schedule of an updated label that stays where it is, in ``conn``."""
    schedule = after_update(app, machine, label)
    if schedule is not None:
        schedules.schedule(conn, [schedule], now=app.now())


def _backfilled(app: App, label: Label) -> Schedule:
    machine = app.config.get_machine(label.state_machine)  # _schedule: the label's own version's
    planned = _schedule(app, machine, label, after=app.now())
    if planned is None:  # nothing to compute: the row is only marked as seen
        return Schedule(label.key, label.entry_id, None, label.due_at)
    due = planned.due_at
    if label.due_at is not None and (due is None or label.due_at < due):
        due = label.due_at
    return Schedule(label.key, label.entry_id, planned.next_check_at, due)


def _schedule(
    app: App,
    machine: StateMachine,
    label: Label,
    *,
    after: datetime.datetime,
    retry_at: datetime.datetime | None = None,
) -> GateSchedule | None:
    state = _state(_governing(app, machine, label), label.state)
    if state is None or not is_scheduled(state):
        return None
    assert isinstance(state, Gate)
    return schedule_gate(
        state, plan_input_of(label), after=after, system_zone=app.system_zone, retry_at=retry_at
    )


def _governing(app: App, machine: StateMachine, label: Label) -> StateMachine:
    """The definition that governs ``label``: its own version's on a ``continue`` machine.

    ``machine`` when that version cannot be found (logged where it was loaded).
    """
    if label.state_machine != machine.name:
        return machine
    return machine_for(app, label) or machine


def _state(machine: StateMachine, name: str) -> State | None:
    try:
        return machine.get_state(name)
    except KeyError:
        return None


def plan_input_of(label: Label) -> PlanInput:
    """What planning needs of a stored label: where it is and what it carries."""
    return PlanInput(
        label=label.name,
        state=label.state,
        metadata=label.metadata,
        entered_at=label.state_entered_at,
        previous_state=label.previous_state,
    )
