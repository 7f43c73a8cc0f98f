"""Choosing the next state from a context."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from routemaster.config import ConstantNext, ContextNext, ContextNextDestination, NoNext
from routemaster.exit_conditions import Context, FeedUnavailable
from routemaster.machine.next_state import choose_next_state

NOW = datetime.datetime(2024, 3, 1, 12, 0, tzinfo=datetime.UTC)


def _context(metadata: dict[str, Any], **extra: Any) -> Context:
    return Context(label="alice", metadata=metadata, now=NOW, **extra)


BY_VALUE = ContextNext(
    path=("metadata", "choice"),
    default="fallback",
    destinations=(
        ContextNextDestination(True, "yes"),
        ContextNextDestination(1, "one"),
        ContextNextDestination("b", "bee"),
        ContextNextDestination(None, "nothing"),
        ContextNextDestination([1, {"k": False}], "nested"),
    ),
)


def test_constant_and_end() -> None:
    assert choose_next_state(ConstantNext("next"), _context({})) == "next"
    assert choose_next_state(NoNext(), _context({})) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "yes"),
        (1, "one"),
        (1.0, "one"),  # JSON numbers: 1 and 1.0 are the same value
        ("b", "bee"),
        ("1", "fallback"),  # text is not a number
        (False, "fallback"),
        (0, "fallback"),
        ([1.0, {"k": False}], "nested"),
        ([1, {"k": 0}], "fallback"),  # False is not 0, at any depth
        ({"k": 1}, "fallback"),
    ],
)
def test_context_transition_matches_by_json_equality(value: Any, expected: str) -> None:
    assert choose_next_state(BY_VALUE, _context({"choice": value})) == expected


def test_true_does_not_match_one() -> None:
    only_one = ContextNext(("metadata", "x"), "other", (ContextNextDestination(1, "one"),))
    assert choose_next_state(only_one, _context({"x": True})) == "other"


def test_a_missing_value_is_null() -> None:
    assert choose_next_state(BY_VALUE, _context({})) == "nothing"


def test_first_matching_destination_wins() -> None:
    rule = ContextNext(
        ("metadata", "x"),
        "d",
        (ContextNextDestination(2, "first"), ContextNextDestination(2.0, "second")),
    )
    assert choose_next_state(rule, _context({"x": 2})) == "first"


def test_history_and_feed_paths() -> None:
    by_previous = ContextNext(
        ("history", "previous_state"), "d", (ContextNextDestination("review", "back"),)
    )
    assert choose_next_state(by_previous, _context({}, previous_state="review")) == "back"

    by_feed = ContextNext(("feeds", "plans", "tier"), "d", (ContextNextDestination("gold", "g"),))
    assert choose_next_state(by_feed, _context({}, fetch_feed=lambda name: {"tier": "gold"})) == "g"

    def down(name: str) -> Any:
        raise FeedUnavailable(name, "connection refused")

    with pytest.raises(FeedUnavailable):
        choose_next_state(by_feed, _context({}, fetch_feed=down))
