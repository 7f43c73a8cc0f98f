"""Child labels (SPEC G3): spawning them, counting them, and the parent's decision.

A label entering a ``spawn`` state is due at once. The worker takes due
parents one at a time, each in a transaction of its own holding the
parent's row lock (:func:`run_spawns`): while children remain to be
created it creates the next :data:`SPAWN_BATCH` of them and records how far
it got in the same transaction (a worker killed meanwhile leaves the next
one to redo nothing: the names already taken are skipped); once all exist
it counts them (their own rows' states, :mod:`routemaster.db.children`) and
moves the parent on by ``next`` if ``wait`` is met, as a gate moves.

A child that finishes (enters a state with an ``outcome``, or is deleted)
leaves word beside itself in its own transaction (:func:`note_finished`,
called by every writer of moves and deletions); the worker turns the word
into its parent's due time (:func:`wake_parents`) and decides in the same
round. A parent still waiting is looked at again every :data:`RECHECK`
anyway, so a word never written (a writer of an older release) delays the
decision, never loses it. Children of a parent that left its spawn state
(by ``next``, an operator's move, or its deletion) are deleted, forced, if
the state says ``on_exit: delete`` (:func:`close_left`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Config, Spawn, StateMachine
from routemaster.db import children as store
from routemaster.db import label_claims, transitions
from routemaster.db import labels as label_store
from routemaster.db.history import version_for
from routemaster.db.labels import Label, LabelKey
from routemaster.machine import evaluates_on_entry, plan_moves
from routemaster.machine.planning import context_for
from routemaster.service.child_words import (
    machine_named,
    note_deleted,
    outcome_of,
    spawn_states,
    state_named,
)
from routemaster.service.labels import log_transition, moves_for, write
from routemaster.service.refusals import LabelNotFound, Malformed
from routemaster.service.scheduling import arrival, plan_input_of
from routemaster.service.transactions import reading, writing
from routemaster.service.versions import machine_for

logger = logging.getLogger(__name__)

MAX_DEPTH = 8
"""The longest chain of spawns: a label this deep in children that would spawn is errored."""

MAX_ITEMS = 100_000
"""The longest list a spawn state spawns from."""

SPAWN_BATCH = 1_000
"""Children created per transaction."""

SPAWNS_PER_ROUND = 20
"""Parents (a batch of children each, or a decision) a worker's round takes at most."""

RECHECK = datetime.timedelta(seconds=30)
"""How often a waiting parent is counted again with no word from a child."""

RECORDED_AT_MOST = 1_000
"""Running children a parent's count looks at on their own rows (finishes not recorded)."""
"""How often a waiting parent is counted again with no word from a child."""

StateKey = tuple[str, str]


# --- waking parents -------------------------------------------------------------------------


def wake_parents(app: App, *, limit: int) -> int:
    """The worker's step: children's words turned into their parents' due times."""
    states = spawn_states(app.config)
    if not states:
        return 0
    with writing(app) as conn:
        return store.wake_parents(conn, states, limit=limit, now=app.now())


# --- the parent -----------------------------------------------------------------------------


def run_spawns(app: App, *, limit: int) -> int:
    """The worker's step: up to ``limit`` due parents, each spawned a batch or decided in a
    transaction of its own; how many were taken."""
    states = spawn_states(app.config)
    if not states:
        return 0
    done = 0
    for _ in range(limit):
        with writing(app) as conn:
            due = label_claims.lock_due_gates(conn, states, limit=1, now=app.now())
            if not due:
                break
            _advance(conn, app, due[0])
        done += 1
    return done


def _advance(conn: sa.Connection, app: App, parent: Label) -> None:
    """One step for the locked ``parent``: spawn a batch, or count and maybe move on."""
    now = app.now()
    machine = machine_for(app, parent)
    spawn = state_named(machine, parent.state) if machine is not None else None
    if machine is None or not isinstance(spawn, Spawn):
        store.recheck_at(conn, parent.key, entry_id=parent.entry_id, due_at=None)
        return
    progress = store.progress(conn, parent.key)
    if progress is None or progress.entry_id != parent.entry_id:
        started = _start(conn, app, parent, spawn, now)
        if started is None:
            return
        progress = started
    if progress.spawned < progress.total:
        _spawn_batch(conn, app, parent, spawn, progress, now)
        return
    counts = count(conn, app, parent.key, spawn, recording=True)
    plan = plan_moves(
        machine,
        dataclasses.replace(plan_input_of(parent), children=counts),
        now=now,
        evaluate=True,
        limit=app.settings.max_transitions,
    )
    if plan.moves:
        write(conn, app, [moves_for(app, machine, parent, plan, now)], now=now)
        if app.metrics is not None:
            app.metrics.spawn_decisions.labels(parent.state_machine, parent.state).inc()
        return
    waited = spawn.met(counts["succeeded"], counts["running"])
    retry = now + app.settings.evaluation_retry_delay if plan.feed_missing else now + RECHECK
    # Met in an end state: nothing more to decide, nothing due.
    store.recheck_at(conn, parent.key, entry_id=parent.entry_id, due_at=None if waited else retry)


def _start(
    conn: sa.Connection, app: App, parent: Label, spawn: Spawn, now: datetime.datetime
) -> store.SpawnProgress | None:
    """The parent's first step in this entry: check its list and depth, record the start.
    ``None`` when the parent was errored instead."""
    items = context_for(plan_input_of(parent), now).lookup(spawn.for_each)
    problem = None
    depth = store.depth_of(conn, parent.key) + 1
    if not isinstance(items, list):
        problem = f"spawn {spawn.name}: {'.'.join(spawn.for_each)} is not a list"
    elif len(items) > MAX_ITEMS:
        problem = (
            f"spawn {spawn.name}: {'.'.join(spawn.for_each)} has {len(items)} elements"
            f" (at most {MAX_ITEMS})"
        )
    elif depth > MAX_DEPTH:
        problem = (
            f"spawn {spawn.name}: nesting deeper than {MAX_DEPTH} spawns"
            f" (this label is a child {depth - 1} spawns deep)"
        )
    if problem is not None:
        transitions.become_errored(
            conn,
            [transitions.Erring(parent.state_machine, parent.name, parent.entry_id, problem)],
            now=now,
        )
        return None
    assert isinstance(items, list)
    return store.start(
        conn,
        parent.key,
        state=spawn.name,
        entry_id=parent.entry_id,
        total=len(items),
        depth=depth,
    )


def _spawn_batch(
    conn: sa.Connection,
    app: App,
    parent: Label,
    spawn: Spawn,
    progress: store.SpawnProgress,
    now: datetime.datetime,
) -> None:
    """The next batch of children, and the progress, in ``conn``'s transaction; the parent
    stays due so that the next batch follows."""
    items = context_for(plan_input_of(parent), now).lookup(spawn.for_each)
    items = items if isinstance(items, list) else []
    child = app.config.get_machine(spawn.machine)
    initial = child.initial_state
    upto = min(progress.spawned + SPAWN_BATCH, progress.total)
    new = [
        _new_child(app, child, parent, position, items[position], now)
        for position in range(progress.spawned, min(upto, len(items)))
    ]
    version = app.versions.in_force.get(child.name) if child.keeps_versions else None
    created = transitions.create_children(
        conn,
        parent.key,
        child.name,
        new,
        state=initial.name,
        depth=progress.depth,
        version=version,
        history_version=version_for(conn, child.name, version),
        now=now,
    )
    store.record_spawned(conn, parent.key, spawned=upto)
    store.recheck_at(conn, parent.key, entry_id=parent.entry_id, due_at=now)
    if app.metrics is not None and created:
        app.metrics.children_spawned.labels(parent.state_machine, spawn.name).inc(created)


def _new_child(
    app: App,
    child: StateMachine,
    parent: Label,
    position: int,
    item: Any,
    now: datetime.datetime,
) -> store.NewChild:
    name = f"{parent.name}/{position}"
    metadata = {
        "item": item,
        "parent": {"state_machine": parent.state_machine, "label": parent.name},
    }
    initial = child.initial_state
    due_at, next_check_at = arrival(
        app, child, name, metadata, state=initial.name, previous_state=None, now=now
    )
    if evaluates_on_entry(initial):
        due_at = now  # evaluated on entry: the worker evaluates it at once
    return store.NewChild(name, position, metadata, due_at, next_check_at)


def count(
    conn: sa.Connection, app: App, parent: LabelKey, spawn: Spawn, *, recording: bool = False
) -> dict[str, int]:
    """``children.total``, ``succeeded``, ``failed`` and ``running`` of ``parent`` in ``spawn``,
    as their recorded outcomes say. ``recording`` (the parent's evaluation, holding its
    row): when at most :data:`RECORDED_AT_MOST` are running, finishes no writer recorded
    are looked for on their own rows and recorded first."""
    found = store.counts(conn, parent, spawn.machine)
    running = found.get(None, 0)
    if recording and 0 < running <= RECORDED_AT_MOST:
        child = machine_named(app.config, spawn.machine)
        unrecorded = store.unrecorded(conn, parent, spawn.machine, limit=RECORDED_AT_MOST)
        outcomes = [
            (name, outcome)
            for name, state, deleted in unrecorded
            for outcome in ["failed" if deleted else outcome_of(child, state) if child else None]
            if outcome is not None
        ]
        if outcomes:
            store.record_outcomes(conn, spawn.machine, outcomes)
            found = store.counts(conn, parent, spawn.machine)
    succeeded, failed = found.get("succeeded", 0), found.get("failed", 0)
    running = found.get(None, 0)
    return {
        "total": succeeded + failed + running,
        "succeeded": succeeded,
        "failed": failed,
        "running": running,
    }


# --- parents that left ----------------------------------------------------------------------


def close_left(app: App, *, limit: int) -> int:
    """The worker's step: parents that left a spawn state. With ``on_exit: delete`` their
    children still running are deleted, forced, a batch per transaction (at most ``limit``
    batches a run: a parent with more is taken up again at the next run); then the
    parent's progress row goes. How many batches were done."""
    if not spawn_states(app.config):
        return 0
    with reading(app) as conn:
        left = store.left(conn, limit=limit)
    done = 0
    for parent, state, entry_id in left:
        while done < limit:
            done += 1
            if _close_batch(app, parent, state, entry_id):
                break
    return done


def _close_batch(app: App, parent: LabelKey, state: str, entry_id: int) -> bool:
    """Delete a batch of the children still running; whether none are left."""
    machine = machine_named(app.config, parent[0])
    spawn = state_named(machine, state) if machine is not None else None
    now = app.now()
    with writing(app) as conn:
        if isinstance(spawn, Spawn) and spawn.on_exit_delete:
            names = store.running(conn, parent, spawn.machine, limit=SPAWN_BATCH // 10)
            reason = f"on_exit: delete: {parent[0]}/{parent[1]} left {state}"
            for name in names:
                _delete_forced(conn, app, (spawn.machine, name), reason, now)
            if names:
                return False
        store.forget(conn, parent, entry_id=entry_id)
    return True


def _delete_forced(
    conn: sa.Connection, app: App, key: LabelKey, reason: str, now: datetime.datetime
) -> None:
    label = label_store.lock(conn, *key)
    if label is None or label.deleted:
        return
    transitions.record_forced(conn, label, now=now, reason=reason)
    old_state = transitions.soft_delete(conn, key[0], key[1], now=now)
    note_deleted(conn, app.config, [key])
    log_transition(app, key[0], key[1], old_state, None, forced=True)


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Child:
    state_machine: str
    label: str
    state: str
    outcome: str | None  # "succeeded", "failed", or None while it runs
    metadata: Mapping[str, Any]
    position: int


OUTCOME_FILTERS = ("succeeded", "failed", "running")


def list_children(
    app: App,
    machine: StateMachine,
    name: str,
    *,
    outcome: str | None,
    after: int,
    limit: int,
) -> list[Child]:
    """The children of label ``name`` in the order they were spawned, after position
    ``after``; ``outcome``: only those succeeded, failed, or still running."""
    if outcome is not None and outcome not in OUTCOME_FILTERS:
        raise Malformed(f"outcome must be one of {', '.join(OUTCOME_FILTERS)}, got {outcome!r}")
    with reading(app) as conn:
        label = label_store.get(conn, machine.name, name)
        if label is None:
            raise LabelNotFound(name)
        found: list[Child] = []
        for child_machine in _spawned_machines(app.config, machine):
            if len(found) >= limit:
                break
            rows = store.page(
                conn,
                label.key,
                child_machine.name,
                after=after,
                limit=limit - len(found),
                outcome=outcome,
            )
            found.extend(
                Child(
                    row.state_machine, row.name, row.state, row.outcome, row.metadata, row.position
                )
                for row in rows
            )
    found.sort(key=lambda child: child.position)
    return found[:limit]


def _spawned_machines(config: Config, machine: StateMachine) -> list[StateMachine]:
    """The machines ``machine``'s spawn states create children in (each once)."""
    names = dict.fromkeys(state.machine for state in machine.states if isinstance(state, Spawn))
    return [found for name in names for found in [machine_named(config, name)] if found]


def explain(app: App, label: Label, spawn: Spawn) -> dict[str, Any]:
    """A waiting parent's part of an explanation: its spawn settings and children counted."""
    with reading(app) as conn:
        progress = store.progress(conn, label.key)
        counts = count(conn, app, label.key, spawn)
    spawning = progress is not None and progress.entry_id == label.entry_id
    return {
        "spawn": {
            "machine": spawn.machine,
            "for_each": ".".join(spawn.for_each),
            "wait": "all" if spawn.at_least is None else {"at_least": spawn.at_least},
            "on_exit": "delete" if spawn.on_exit_delete else "keep",
            "spawned": progress.spawned if spawning and progress else 0,
            "to_spawn": progress.total if spawning and progress else None,
        },
        "children": counts,
        "wait_met": spawning
        and progress is not None
        and progress.spawned >= progress.total
        and spawn.met(counts["succeeded"], counts["running"]),
    }


def parent_of(app: App, key: LabelKey) -> dict[str, str] | None:
    """``{"state_machine", "label"}`` of the label that spawned ``key``, if one did."""
    if key[0] not in app.config.child_machines:
        return None
    with reading(app) as conn:
        parent = store.parent_of(conn, key)
    return None if parent is None else {"state_machine": parent[0], "label": parent[1]}
