"""Where a label goes from here: a bounded chain of moves, decided without I/O.

The label service gives the label as planning sees it (:class:`PlanInput`), the time, and a way to
read feeds; :func:`plan_moves` answers with the states the label passes
through. Reading a feed that is not at hand stops the chain there (the
service fetches it outside any transaction and plans again), so a plan never
waits on the network.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from routemaster.config.model import Action, Gate, Spawn, State, StateMachine
from routemaster.exit_conditions import Context, FeedUnavailable
from routemaster.machine.next_state import choose_next_state
from routemaster.machine.triggers import evaluates_on_entry

FeedReader = Callable[[str], Any]
"""A feed's JSON by name, or :class:`FeedUnavailable`."""


@dataclass(frozen=True)
class PlanInput:
    """What planning needs to know of a label: where it is and what it carries."""

    label: str
    state: str
    metadata: Mapping[str, Any]
    entered_at: datetime.datetime
    previous_state: str | None
    # in a spawn state: its children counted (the parent's evaluation counts them, SPEC G3)
    children: Mapping[str, int] | None = None


@dataclass(frozen=True)
class Plan:
    """The states a label passes through, in order, and why the chain stopped where it did."""

    states: tuple[str, ...] = ()
    ends_in_action: bool = False  # the last state is an action: its webhook is owed
    # The evaluation after the moves could not read this feed: fetch, then plan again.
    feed_missing: FeedUnavailable | None = None

    @property
    def moves(self) -> bool:
        return bool(self.states)


def no_feeds(name: str) -> Any:
    """A :data:`FeedReader` for planning inside a transaction: nothing fetched yet."""
    raise FeedUnavailable(name, "not fetched yet")


def context_for(
    plan_input: PlanInput, now: datetime.datetime, read_feed: FeedReader = no_feeds
) -> Context:
    """The evaluation context of ``plan_input`` at ``now``."""
    return Context(
        label=plan_input.label,
        metadata=plan_input.metadata,
        now=now,
        entered_state=plan_input.entered_at,
        previous_state=plan_input.previous_state,
        current_state=plan_input.state,
        fetch_feed=read_feed,
        children=plan_input.children,
    )


def plan_moves(
    machine: StateMachine,
    plan_input: PlanInput,
    *,
    now: datetime.datetime,
    evaluate: bool,
    limit: int,
    read_feed: FeedReader = no_feeds,
) -> Plan:
    """Decide which states the label passes through from ``plan_input``.

    ``evaluate``: whether the current state is evaluated at all (a trigger
    fired, or the label just entered it). In a gate the exit condition must
    hold; in an action, evaluating means its webhook was delivered and the
    label leaves. Each state entered is then evaluated only if it has an entry
    trigger; the chain ends in an action, after ``limit`` moves, or where the
    machine keeps the label.
    """
    states: list[str] = []
    current = plan_input
    for _ in range(limit):
        state = _state_or_none(machine, current.state)
        if state is None or not evaluate:
            break
        context = context_for(current, now, read_feed)
        try:
            if isinstance(state, Gate) and not state.exit_condition.evaluate(context):
                break
            if isinstance(state, Spawn) and not _waited(state, current.children):
                break
            destination = choose_next_state(state.next_states, context)
        except FeedUnavailable as missing:
            return Plan(tuple(states), _is_action(machine, states), missing)
        if destination is None:
            break
        states.append(destination)
        current = PlanInput(current.label, destination, current.metadata, now, current.state)
        entered = machine.get_state(destination)
        if isinstance(entered, Action):
            break
        evaluate = evaluates_on_entry(entered)
    return Plan(tuple(states), _is_action(machine, states))


def _waited(spawn: Spawn, children: Mapping[str, int] | None) -> bool:
    """Whether a parent's wait in ``spawn`` is over (never without its children counted)."""
    if children is None:
        return False
    return spawn.met(children["succeeded"], children["running"])


def _is_action(machine: StateMachine, states: list[str]) -> bool:
    return bool(states) and isinstance(machine.get_state(states[-1]), Action)


def _state_or_none(machine: StateMachine, name: str) -> State | None:
    try:
        return machine.get_state(name)
    except KeyError:
        return None
