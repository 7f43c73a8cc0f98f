"""Evaluating compiled conditions against contexts."""

from __future__ import annotations

import datetime
import json

import pytest

from routemaster.exit_conditions import FeedUnavailable, compile_condition
from tests.exit_conditions.conftest import FEEDS, NOW, FeedServer, MakeContext

CASES = [
    # literals in boolean position
    ("true", True),
    ("false", False),
    ("null", False),
    ("1", True),
    ("0", False),
    ('""', False),
    ("'x'", True),
    # comparisons
    ("metadata.count = 3", True),
    ("metadata.count = 3.0", True),
    ("metadata.count /= 3", False),
    ("metadata.count > 2", True),
    ("metadata.count >= 3", True),
    ("metadata.count < 3", False),
    ("metadata.count <= 3", True),
    ("metadata.ratio > 0.5", True),
    ("metadata.debt < -10", True),
    ("metadata.name = 'alice'", True),
    ('metadata.name < "bob"', True),
    ("metadata.user.address.city = 'London'", True),
    ("metadata.tags.0 = 'a'", True),
    ("metadata.tags.7 = null", True),
    ("metadata.tags = metadata.tags", True),
    ("metadata.quote = 'it\\'s \"quoted\"\\n'", True),
    # booleans are not numbers; incompatible types are unequal and unordered
    ("metadata.flag = true", True),
    ("metadata.flag = 1", False),
    ("metadata.count = true", False),
    ("metadata.name > 3", False),
    ("metadata.name < 3", False),
    ("metadata.name = 3", False),
    ("metadata.name /= 3", True),
    # null
    ("metadata.missing = null", True),
    ("metadata.nothing = null", True),
    ("metadata.missing > 1", False),
    ("metadata.missing < 1", False),
    ("metadata.missing <= null", False),
    ("metadata.missing /= 1", True),
    ("metadata.missing", False),
    ("metadata.missing.deeper = null", True),
    ("metadata.count.deeper is defined", False),
    # is defined
    ("metadata.user is defined", True),
    ("metadata.off is defined", True),
    ("metadata.nothing is defined", False),
    ("metadata.nope is defined", False),
    ("metadata.nope is not defined", True),
    # is in
    ("'a' is in metadata.tags", True),
    ("'z' is in metadata.tags", False),
    ("'z' is not in metadata.tags", True),
    ("2.5 is in metadata.numbers", True),
    ("true is in metadata.numbers", False),
    ("'lic' is in metadata.name", True),
    ("3 is in metadata.name", False),
    ("'city' is in metadata.user.address", True),
    ("'x' is in metadata.missing", False),
    ("'x' is not in metadata.missing", True),
    ("'x' is in metadata.count", False),
    # has passed since (entered two days before NOW)
    ("1d has passed since history.entered_state", True),
    ("2d has passed since history.entered_state", True),
    ("2d1s has passed since history.entered_state", False),
    ("3d has not passed since history.entered_state", True),
    ("1d12h has passed since system.entered_state", True),
    ("1d has passed since metadata.missing", False),
    ("1d has not passed since metadata.missing", True),
    ("1d has passed since metadata.paid_at", True),
    ("1h has passed since metadata.naive_at", True),
    ("1h1s has passed since metadata.naive_at", False),
    ("1d has passed since metadata.name", False),
    ("1d has passed since metadata.count", False),
    # history and system
    ("history.previous_state = 'start'", True),
    ("history.current_state = 'waiting'", True),
    ("system.label = 'label-1'", True),
    ("system.now > history.entered_state", True),
    ("system.now = metadata.now_text", True),
    ("metadata.paid_at < system.now", True),
    # times of day (NOW is 12:00 UTC)
    ("system.time >= 12:00", True),
    ("system.time = 12:00:00", True),
    ("system.time < 11:59:59", False),
    ("system.time > 18:30", False),
    ("metadata.closing > system.time", True),
    ("metadata.closing = 18:30", True),
    ("system.time = metadata.count", False),
    # durations
    ("1h30m = 90m", True),
    ("1d > 23h", True),
    ("1d = 24h", True),
    ("45s < 1m", True),
    # not / and / or
    ("not metadata.flag", False),
    ("not not metadata.flag", True),
    ("not metadata.count = 4", True),
    ("metadata.count = 3 and metadata.flag", True),
    ("metadata.count = 4 or metadata.flag", True),
    ("metadata.count = 4 or metadata.off", False),
    ("(false and false) or true", True),
    ("metadata.count = 3 # a comment\nand\n  metadata.flag # another\n", True),
]


@pytest.mark.parametrize(("source", "expected"), CASES)
def test_evaluates(make_context: MakeContext, source: str, expected: bool) -> None:
    program = compile_condition(source)
    context = make_context()
    assert program.evaluate(context) is expected
    assert program.explain(context).result is expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # routemaster 1.x: `or` binds tighter than `and`.
        ("false and false or true", False),
        ("true or false and false", False),
        ("false and (false or true)", False),
        ("(false and false) or true", True),
    ],
)
def test_or_binds_tighter_than_and(make_context: MakeContext, source: str, expected: bool) -> None:
    assert compile_condition(source).evaluate(make_context()) is expected


def test_mixing_and_or_warns_with_the_meaning() -> None:
    program = compile_condition("metadata.a and\n metadata.b or metadata.c")
    assert program.warnings == (
        "line 1: 'and' and 'or' mixed without parentheses; 'or' binds tighter than 'and' "
        "(as in routemaster 1.x), so this means (metadata.a and (metadata.b or metadata.c))",
    )


@pytest.mark.parametrize(
    "source",
    ["metadata.a and (metadata.b or metadata.c)", "metadata.a and metadata.b", "true"],
)
def test_no_warning_when_unambiguous(source: str) -> None:
    assert compile_condition(source).warnings == ()


def test_time_of_day_is_utc(make_context: MakeContext) -> None:
    paris_noon = datetime.datetime(
        2024, 3, 1, 13, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    context = make_context(now=paris_noon)
    assert compile_condition("system.time = 12:00").evaluate(context) is True


def test_paths_and_feeds() -> None:
    program = compile_condition(
        "feeds.jacquard.variant = 'b' and metadata.a.b > 1 or "
        "1d has passed since history.entered_state and system.time > 18:00"
    )
    assert program.paths == frozenset(
        {
            ("feeds", "jacquard", "variant"),
            ("metadata", "a", "b"),
            ("history", "entered_state"),
            ("system", "time"),
        }
    )
    assert program.feeds == frozenset({"jacquard"})


def test_programs_compare_and_hash_by_source() -> None:
    assert compile_condition("metadata.a = 1") == compile_condition("metadata.a = 1")
    assert compile_condition("metadata.a = 1") != compile_condition("metadata.a=1")
    assert len({compile_condition("true"), compile_condition("true")}) == 1


def test_feeds_are_fetched_once_per_evaluation(make_context: MakeContext) -> None:
    feeds = FeedServer(FEEDS)
    program = compile_condition("feeds.jacquard.variant = 'b' and feeds.jacquard.score > 5")
    assert program.evaluate(make_context(feeds=feeds)) is True
    assert feeds.fetches == {"jacquard": 1}


def test_feeds_are_fetched_only_when_read(make_context: MakeContext) -> None:
    feeds = FeedServer(FEEDS)
    program = compile_condition("metadata.off and feeds.jacquard.variant = 'b'")
    assert program.evaluate(make_context(feeds=feeds)) is False
    assert feeds.fetches == {}


def test_missing_feed_field_is_null(make_context: MakeContext) -> None:
    program = compile_condition("feeds.empty.x is not defined and feeds.unknown.y = null")
    assert program.evaluate(make_context()) is True


def test_unavailable_feed_propagates(make_context: MakeContext) -> None:
    feeds = FeedServer(FEEDS, down=frozenset({"jacquard"}))
    program = compile_condition("metadata.flag and feeds.jacquard.variant = 'b'")
    with pytest.raises(FeedUnavailable) as raised:
        program.evaluate(make_context(feeds=feeds))
    assert raised.value.feed == "jacquard"


def test_explanation_reports_unavailable_feed(make_context: MakeContext) -> None:
    feeds = FeedServer(FEEDS, down=frozenset({"jacquard"}))
    explanation = compile_condition("feeds.jacquard.variant = 'b'").explain(
        make_context(feeds=feeds)
    )
    assert explanation.result is None
    assert explanation.error == "feed 'jacquard' unavailable: 503 from http://feeds.test"
    assert explanation.to_json()["clause"]["children"][0]["error"] == explanation.error


def test_explanation_shows_clauses_values_and_skips(make_context: MakeContext) -> None:
    program = compile_condition(
        "metadata.count > 5 or 1d has passed since history.entered_state\n"
        "and (metadata.name = 'bob' and metadata.flag)"
    )
    explanation = program.explain(make_context())
    assert explanation.result is False
    assert [(c.text, c.kind, c.held) for c in explanation.clauses()] == [
        (program.source, "and", False),
        ("metadata.count > 5 or 1d has passed since history.entered_state", "or", True),
        ("metadata.count > 5", "comparison", False),
        ("1d has passed since history.entered_state", "has passed", True),
        ("(metadata.name = 'bob' and metadata.flag)", "and", False),
        ("metadata.name = 'bob'", "comparison", False),
        ("metadata.flag", "lookup", None),
    ]
    clauses = list(explanation.clauses())
    assert clauses[2].values == (("metadata.count", 3),)
    assert clauses[3].values == (
        ("history.entered_state", NOW - datetime.timedelta(days=2)),
        ("now", NOW),
    )
    assert not clauses[-1].evaluated
    document = explanation.to_json()
    assert json.loads(json.dumps(document)) == document
    assert document["clause"]["children"][0]["children"][1]["values"] == [
        {"text": "history.entered_state", "value": "2024-02-28T12:00:00+00:00"},
        {"text": "now", "value": "2024-03-01T12:00:00+00:00"},
    ]
    assert document["warnings"] == list(program.warnings)


def test_explanation_of_parenthesised_operand(make_context: MakeContext) -> None:
    explanation = compile_condition("(metadata.flag or metadata.off) = false").explain(
        make_context()
    )
    assert explanation.result is False
    comparison = explanation.clause
    assert comparison.values == (("(metadata.flag or metadata.off)", True),)
    assert comparison.children[0].kind == "or"
    assert comparison.children[0].children[1].held is None


def test_canonical_form() -> None:
    program = compile_condition(
        "metadata.a = 1.5 and not metadata.b or 1d12h has not passed since metadata.t"
        " # a comment\n and 'x\"y' is not in metadata.l and system.time >= 18:30:05"
        " and null is defined"
    )
    assert program.canonical() == (
        "((metadata.a = 1.5) and ((not metadata.b) or (1d12h has not passed since metadata.t))"
        ' and ("x\\"y" is not in metadata.l) and (system.time >= 18:30:05) and (null is defined))'
    )


def test_explaining_a_value_nested_without_limit_is_bounded(make_context: MakeContext) -> None:
    deep: object = "leaf"
    for _ in range(50_000):
        deep = [deep]
    explanation = compile_condition("metadata.deep = 1").explain(make_context({"deep": deep}))
    assert explanation.result is False
    document = explanation.to_json()
    rendered = json.dumps(document)  # no RecursionError rendering or encoding it
    assert "nested deeper than 256 levels" in rendered
