"""Which events evaluate a gate: metadata triggers as in 1.x, entry triggers, the words for it."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routemaster.config import (
    Action,
    ConstantNext,
    EntryTrigger,
    Gate,
    IntervalTrigger,
    MetadataTrigger,
    NamedTimezone,
    NoNext,
    TimeTrigger,
    Trigger,
)
from routemaster.exit_conditions import compile_condition
from routemaster.machine import evaluates_on_entry, update_fires
from routemaster.machine.triggers import what_evaluates


def gate(*triggers: Trigger) -> Gate:
    return Gate(
        name="waiting",
        exit_condition=compile_condition("metadata.payment.paid = true"),
        triggers=triggers,
        next_states=ConstantNext("done"),
    )


ACTION = Action(name="notify", webhook="http://127.0.0.1:9/notify", next_states=NoNext())
ON_PAID = gate(MetadataTrigger(("payment", "paid")))


@pytest.mark.parametrize(
    "body",
    [
        {"payment": {"paid": True}},
        {"payment": {"paid": False}},
        {"payment": {"paid": None}},  # setting it to null is touching it
        {"payment": {"paid": {"by": "card"}}},
        {"payment": {"paid": True, "amount": 3}, "other": 1},
    ],
)
def test_an_update_whose_body_contains_the_path_fires(body: dict[str, Any]) -> None:
    assert update_fires(ON_PAID, body)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"payment": 5},  # the parent replaced by a scalar
        {"payment": None},
        {"payment": "paid"},  # ... by a string
        {"payment": ["paid"]},  # ... by a list
        {"payment": [{"paid": True}]},
        {"payment": {}},
        {"payment": {"amount": 3}},  # a sibling
        {"paid": True},  # the leaf at the wrong depth
        {"payment.paid": True},  # a dotted key is not a path
        {"other": {"payment": {"paid": True}}},
    ],
)
def test_an_update_that_does_not_contain_the_path_does_not_fire(body: dict[str, Any]) -> None:
    assert not update_fires(ON_PAID, body)


def test_a_trigger_on_a_parent_fires_for_any_child() -> None:
    on_payment = gate(MetadataTrigger(("payment",)))
    assert update_fires(on_payment, {"payment": {"paid": True}})
    assert update_fires(on_payment, {"payment": 5})
    assert update_fires(on_payment, {"payment": None})
    assert not update_fires(on_payment, {"shipping": {"payment": 1}})


def test_any_of_several_metadata_triggers_fires() -> None:
    either = gate(MetadataTrigger(("payment", "paid")), MetadataTrigger(("stock",)))
    assert update_fires(either, {"stock": 1})
    assert update_fires(either, {"payment": {"paid": True}})
    assert not update_fires(either, {"payment": {"amount": 1}})


def test_gates_without_metadata_triggers_and_actions_never_fire() -> None:
    clock_only = gate(
        EntryTrigger(),
        IntervalTrigger(datetime.timedelta(minutes=5)),
        TimeTrigger(datetime.time(9)),
    )
    assert not update_fires(clock_only, {"payment": {"paid": True}})
    assert not update_fires(gate(), {"payment": {"paid": True}})
    assert not update_fires(ACTION, {"payment": {"paid": True}})


def test_a_gate_is_evaluated_on_entry_only_with_an_entry_trigger() -> None:
    assert evaluates_on_entry(gate(EntryTrigger()))
    assert evaluates_on_entry(gate(MetadataTrigger(("a",)), EntryTrigger()))
    assert not evaluates_on_entry(gate(MetadataTrigger(("a",))))
    assert not evaluates_on_entry(gate(IntervalTrigger(datetime.timedelta(hours=1))))
    assert not evaluates_on_entry(gate())
    # An action entered is owed its webhook; that is delivery, not evaluation.
    assert not evaluates_on_entry(ACTION)


def test_what_evaluates_a_gate_in_words() -> None:
    waiting = gate(
        EntryTrigger(),
        MetadataTrigger(("payment", "paid")),
        IntervalTrigger(datetime.timedelta(minutes=15)),
        TimeTrigger(datetime.time(18, 30), NamedTimezone("Europe/London")),
    )
    assert what_evaluates(waiting) == (
        "an update whose body sets metadata.payment.paid"
        " or the interval trigger (every 15m)"
        " or the daily time trigger (18:30)"
    )
    assert what_evaluates(gate(MetadataTrigger(("stock",)))) == (
        "an update whose body sets metadata.stock"
    )


def test_nothing_evaluates_a_gate_with_only_an_entry_trigger_once_entered() -> None:
    assert what_evaluates(gate(EntryTrigger())) is None
    assert what_evaluates(gate()) is None


# --- property: update_fires agrees with a plain reading of "the body contains the path" ----

KEYS = st.sampled_from(["a", "b", "c"])
SCALARS = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["a", "b", ""])
BODIES: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)


def nested_paths(body: Mapping[str, Any]) -> Iterator[tuple[str, ...]]:
    """Every key path that exists through nested objects of ``body``, each object's keys."""
    for key, value in body.items():
        yield (key,)
        if isinstance(value, dict):
            for rest in nested_paths(value):
                yield (key, *rest)


@settings(max_examples=500, deadline=None)
@given(
    path=st.lists(KEYS, min_size=1, max_size=3).map(tuple),
    body=st.dictionaries(KEYS, BODIES, max_size=3),
)
def test_update_fires_exactly_when_the_body_contains_the_nested_path(
    path: tuple[str, ...], body: dict[str, Any]
) -> None:
    assert update_fires(gate(MetadataTrigger(path)), body) == (path in set(nested_paths(body)))
