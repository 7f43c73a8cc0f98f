"""A child finishing (SPEC G3): the word it leaves for its parent, in its own transaction.

Every writer of moves (:func:`routemaster.service.labels.write`) and of deletions calls
:func:`note_finished` or :func:`note_deleted` in the transaction that moves or deletes
the label: a child of a spawn that enters a state marked ``outcome``, or is deleted,
records its outcome and leaves word for its parent beside itself
(:func:`routemaster.db.children.finish`), never a write to its parent's row, so on Citus
its commit stays on its own shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa

from routemaster.config.model import Config, Spawn, State, StateMachine
from routemaster.db import children as store
from routemaster.db.labels import LabelKey, Moves

StateKey = tuple[str, str]


def spawn_states(config: Config) -> list[StateKey]:
    """Every spawn state of the configuration, as (machine, state)."""
    return [
        (machine.name, state.name)
        for machine in config.state_machines
        for state in machine.states
        if isinstance(state, Spawn)
    ]


def outcome_states(machine: StateMachine) -> tuple[list[str], list[str]]:
    """The machine's states marked ``outcome: succeeded``, and ``outcome: failed``."""
    succeeded = [state.name for state in machine.states if state.outcome == "succeeded"]
    failed = [state.name for state in machine.states if state.outcome == "failed"]
    return succeeded, failed


def note_finished(conn: sa.Connection, config: Config, moves: Sequence[Moves]) -> None:
    """Children among ``moves`` that entered a state with an ``outcome``: recorded, with word
    for their parents, in ``conn``'s transaction, beside each child (nothing is written to a
    parent's row)."""
    machines = config.child_machines
    if not machines:
        return
    finished = []
    for move in moves:
        machine = machine_named(config, move.label.state_machine)
        if machine is None or machine.name not in machines:
            continue
        outcome = next(
            (found for state in move.states if (found := outcome_of(machine, state))), None
        )
        if outcome is not None:
            finished.append((move.label.key, outcome))
    store.finish(conn, finished)


def note_deleted(conn: sa.Connection, config: Config, deleted: Iterable[LabelKey]) -> None:
    """Children among ``deleted``: failed (unless they had finished already), with word for
    their parents."""
    machines = config.child_machines
    store.finish(conn, [(key, "failed") for key in deleted if key[0] in machines])


def machine_named(config: Config, name: str) -> StateMachine | None:
    try:
        return config.get_machine(name)
    except KeyError:
        return None


def state_named(machine: StateMachine | None, name: str) -> State | None:
    if machine is None:
        return None
    try:
        return machine.get_state(name)
    except KeyError:
        return None


def outcome_of(machine: StateMachine, state: str) -> str | None:
    """The outcome a label of ``machine`` in ``state`` has come to (``None``: running)."""
    found = state_named(machine, state)
    return None if found is None else found.outcome
