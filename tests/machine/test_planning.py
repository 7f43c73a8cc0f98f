"""Where a label goes: ``plan_moves`` on machines loaded from YAML, with no database or HTTP."""

from __future__ import annotations

import datetime
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from routemaster.config import StateMachine, load_config
from routemaster.exit_conditions import FeedUnavailable
from routemaster.machine import Plan, PlanInput, plan_moves

NOW = datetime.datetime(2024, 3, 1, 12, 0, tzinfo=datetime.UTC)
EARLIER = NOW - datetime.timedelta(days=1)
LIMIT = 50

Machine = Callable[[str], StateMachine]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """``machine(states_yaml)``: the machine ``m`` with those states (and two feeds), loaded."""

    def load(states: str) -> StateMachine:
        text = (
            "state_machines:\n"
            "  m:\n"
            "    feeds:\n"
            "      - {name: stock, url: 'http://127.0.0.1:9/stock/<label>'}\n"
            "      - {name: prices, url: 'http://127.0.0.1:9/prices/<label>'}\n"
            "    states:\n" + textwrap.indent(textwrap.dedent(states), " " * 6)
        )
        path = tmp_path / "config.yaml"
        path.write_text(text, encoding="utf-8")
        return load_config([path]).get_machine("m")

    return load


def at(
    state: str, metadata: dict[str, Any] | None = None, previous: str | None = None
) -> PlanInput:
    return PlanInput(
        label="alice",
        state=state,
        metadata=metadata or {},
        entered_at=EARLIER,
        previous_state=previous,
    )


def plan(
    machine: StateMachine,
    plan_input: PlanInput,
    *,
    evaluate: bool = True,
    limit: int = LIMIT,
    read_feed: Callable[[str], Any] | None = None,
) -> Plan:
    if read_feed is None:
        return plan_moves(machine, plan_input, now=NOW, evaluate=evaluate, limit=limit)
    return plan_moves(
        machine, plan_input, now=NOW, evaluate=evaluate, limit=limit, read_feed=read_feed
    )


CHAIN = """\
- gate: start
  triggers: [{metadata: ready}]
  exit_condition: metadata.ready = true
  next: checked
- gate: checked
  triggers: [{event: entry}]
  exit_condition: true
  next: approved
- gate: approved
  triggers: [{event: entry}]
  exit_condition: metadata.amount < 100
  next: notify
- action: notify
  webhook: http://127.0.0.1:9/notify
  next: waiting
- gate: waiting
  triggers: [{event: entry}]
  exit_condition: true
  next: done
- gate: done
  exit_condition: false
"""


def test_a_chain_runs_through_gates_with_entry_triggers_and_stops_at_an_action(
    machine: Machine,
) -> None:
    result = plan(machine(CHAIN), at("start", {"ready": True, "amount": 10}))
    assert result.states == ("checked", "approved", "notify")
    assert result.moves
    assert result.ends_in_action  # the webhook of `notify` is owed; the worker sends it
    assert result.feed_missing is None


def test_the_chain_stops_at_a_gate_whose_condition_does_not_hold(machine: Machine) -> None:
    result = plan(machine(CHAIN), at("start", {"ready": True, "amount": 500}))
    assert result.states == ("checked", "approved")
    assert not result.ends_in_action
    assert result.feed_missing is None


def test_a_gate_whose_condition_is_false_plans_nothing(machine: Machine) -> None:
    result = plan(machine(CHAIN), at("start", {"ready": False}))
    assert result == Plan()
    assert not result.moves
    assert not result.ends_in_action


def test_not_evaluating_plans_nothing_even_when_the_condition_holds(machine: Machine) -> None:
    assert plan(machine(CHAIN), at("start", {"ready": True}), evaluate=False) == Plan()
    assert plan(machine(CHAIN), at("notify"), evaluate=False) == Plan()


def test_evaluating_an_action_means_it_was_delivered_and_the_label_leaves(
    machine: Machine,
) -> None:
    result = plan(machine(CHAIN), at("notify", previous="approved"))
    assert result.states == ("waiting", "done")
    assert not result.ends_in_action


def test_a_gate_entered_without_an_entry_trigger_waits_for_its_triggers(
    machine: Machine,
) -> None:
    states = """\
    - gate: start
      triggers: [{event: entry}]
      exit_condition: true
      next: later
    - gate: later
      triggers: [{metadata: ok}]
      exit_condition: true
      next: done
    - gate: done
      exit_condition: false
    """
    assert plan(machine(states), at("start")).states == ("later",)


def test_an_end_state_plans_nothing(machine: Machine) -> None:
    assert plan(machine(CHAIN), at("done")) == Plan()


def test_a_loop_in_the_configuration_is_bounded_by_the_limit(machine: Machine) -> None:
    states = """\
    - gate: ping
      triggers: [{event: entry}]
      exit_condition: true
      next: pong
    - gate: pong
      triggers: [{event: entry}]
      exit_condition: true
      next: ping
    """
    loop = machine(states)
    result = plan(loop, at("ping"), limit=5)
    assert result.states == ("pong", "ping", "pong", "ping", "pong")
    assert not result.ends_in_action
    assert plan(loop, at("ping"), limit=1).states == ("pong",)


def test_each_state_entered_in_the_chain_is_entered_now(machine: Machine) -> None:
    """A gate entered during the chain sees its own entry time and the state before it."""
    states = """\
    - gate: start
      triggers: [{event: entry}]
      exit_condition: true
      next: cooling
    - gate: cooling
      triggers: [{event: entry}]
      exit_condition: 1h has passed since history.entered_state
      next: done
    - gate: came_from_cooling
      exit_condition: false
    - gate: done
      triggers: [{event: entry}]
      exit_condition: history.previous_state = "cooling"
      next: came_from_cooling
    """
    loaded = machine(states)
    # `start` was entered a day ago, but `cooling` is entered now: its hour has not passed.
    assert plan(loaded, at("start")).states == ("cooling",)
    assert plan(loaded, at("cooling")).states == ("done", "came_from_cooling")


CONTEXT = """\
- action: ship
  webhook: http://127.0.0.1:9/ship
  next:
    type: context
    path: metadata.delivery.method
    default: awaiting_delivery
    destinations:
      - {value: collect, state: awaiting_collection}
      - {value: courier, state: awaiting_delivery}
- gate: awaiting_delivery
  exit_condition: false
- gate: awaiting_collection
  exit_condition: false
"""


@pytest.mark.parametrize(
    ("metadata", "destination"),
    [
        ({"delivery": {"method": "collect"}}, "awaiting_collection"),
        ({"delivery": {"method": "courier"}}, "awaiting_delivery"),
        ({"delivery": {"method": "drone"}}, "awaiting_delivery"),  # the default
        ({}, "awaiting_delivery"),
    ],
)
def test_a_context_transition_follows_the_metadata(
    machine: Machine, metadata: dict[str, Any], destination: str
) -> None:
    assert plan(machine(CONTEXT), at("ship", metadata)).states == (destination,)


FEEDS = """\
- gate: start
  triggers: [{event: entry}]
  exit_condition: true
  next: in_stock
- gate: in_stock
  triggers: [{event: entry}]
  exit_condition: |
    metadata.confirmed = true
      or (feeds.stock.available > 0 and feeds.prices.ok = true)
  next: ship
- action: ship
  webhook: http://127.0.0.1:9/ship
  next: done
- gate: done
  exit_condition: false
"""


def test_a_feed_not_at_hand_stops_the_chain_after_the_moves_already_made(
    machine: Machine,
) -> None:
    result = plan(machine(FEEDS), at("start"))
    assert result.states == ("in_stock",)  # the move into `in_stock` stands
    assert not result.ends_in_action
    assert isinstance(result.feed_missing, FeedUnavailable)
    assert result.feed_missing.feed == "stock"


def test_a_feed_not_at_hand_in_the_first_state_plans_no_move(machine: Machine) -> None:
    result = plan(machine(FEEDS), at("in_stock"))
    assert result.states == ()
    assert not result.moves
    assert result.feed_missing is not None


def test_a_condition_that_holds_on_metadata_never_reads_its_feeds(machine: Machine) -> None:
    result = plan(machine(FEEDS), at("start", {"confirmed": True}))
    assert result.states == ("in_stock", "ship")
    assert result.ends_in_action
    assert result.feed_missing is None


def test_a_feed_reader_that_answers_lets_the_chain_continue(machine: Machine) -> None:
    read: list[str] = []

    def read_feed(name: str) -> Any:
        read.append(name)
        return {"stock": {"available": 3}, "prices": {"ok": True}}[name]

    result = plan(machine(FEEDS), at("start"), read_feed=read_feed)
    assert result.states == ("in_stock", "ship")
    assert result.ends_in_action
    assert result.feed_missing is None
    assert read == ["stock", "prices"]


def test_a_feed_whose_answer_fails_the_condition_keeps_the_label(machine: Machine) -> None:
    def read_feed(name: str) -> Any:
        return {"available": 0, "ok": True}

    result = plan(machine(FEEDS), at("start"), read_feed=read_feed)
    assert result.states == ("in_stock",)
    assert result.feed_missing is None


def test_a_feed_that_is_down_stops_the_chain_with_its_reason(machine: Machine) -> None:
    def read_feed(name: str) -> Any:
        raise FeedUnavailable(name, "connection refused")

    result = plan(machine(FEEDS), at("start"), read_feed=read_feed)
    assert result.states == ("in_stock",)
    assert result.feed_missing is not None
    assert result.feed_missing.reason == "connection refused"


def test_a_context_transition_reading_a_feed_not_at_hand_wants_that_feed(
    machine: Machine,
) -> None:
    states = """\
    - action: route
      webhook: http://127.0.0.1:9/route
      next:
        type: context
        path: feeds.prices.tier
        default: standard
        destinations:
          - {value: gold, state: premium}
    - gate: standard
      exit_condition: false
    - gate: premium
      exit_condition: false
    """
    loaded = machine(states)
    stopped = plan(loaded, at("route"))
    assert stopped.states == ()
    assert stopped.feed_missing is not None
    answered = plan(loaded, at("route"), read_feed=lambda name: {"tier": "gold"})
    assert answered.states == ("premium",)


def test_a_state_unknown_to_the_configuration_plans_nothing(machine: Machine) -> None:
    """A label left in a state a newer config removed stays put rather than failing."""
    assert plan(machine(CHAIN), at("removed_state", {"ready": True})) == Plan()
