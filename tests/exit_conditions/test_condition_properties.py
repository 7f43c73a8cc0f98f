"""Property tests: compiling never fails oddly, canonical text round-trips,
and evaluation never crashes whatever the metadata holds."""

from __future__ import annotations

import datetime
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from routemaster.exit_conditions import (
    ConditionSyntaxError,
    Context,
    Program,
    compile_condition,
)
from tests.exit_conditions.conftest import FeedServer
from tests.exit_conditions.strategies import predicates

SETTINGS = settings(max_examples=200, deadline=None)

# --- source text -------------------------------------------------------------

FRAGMENTS = [
    "metadata.a",
    "metadata.b.c",
    "feeds.f.x",
    "history.entered_state",
    "system.time",
    "foo.bar",
    "true",
    "false",
    "null",
    "and",
    "or",
    "not",
    "is",
    "defined",
    "in",
    "has",
    "passed",
    "since",
    "=",
    "/=",
    "==",
    "!=",
    "<",
    ">=",
    "(",
    ")",
    "1d12h",
    "30m",
    "3",
    "-2.5",
    "18:30",
    "25:61",
    "'str'",
    '"a\\"b"',
    "'open",
    "#",
    "1.",
    "3x",
    ".",
    "\n",
]
ARBITRARY_TEXT = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(FRAGMENTS), max_size=12).map(" ".join),
    st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join),
)

_PATHS = st.sampled_from(
    [
        "metadata.a",
        "metadata.b",
        "metadata.b.c",
        "metadata.items.0",
        "feeds.f.x",
        "history.entered_state",
        "history.previous_state",
        "system.now",
        "system.time",
        "system.entered_state",
    ]
)


def _duration(parts: tuple[int, int, int, int]) -> str:
    text = "".join(f"{n}{unit}" for n, unit in zip(parts, "dhms", strict=True) if n)
    return text or "0s"


def _quoted(text: str, quote: str) -> str:
    escaped = text.replace("\\", "\\\\").replace(quote, "\\" + quote).replace("\n", "\\n")
    return f"{quote}{escaped}{quote}"


_DURATIONS = st.tuples(
    st.integers(0, 40), st.integers(0, 30), st.integers(0, 90), st.integers(0, 90)
).map(_duration)
_LITERALS = st.one_of(
    st.sampled_from(["true", "false", "null"]),
    st.integers(-(10**20), 10**20).map(str),
    st.tuples(st.integers(-1000, 1000), st.integers(0, 10**6)).map(lambda t: f"{t[0]}.{t[1]}"),
    _DURATIONS,
    st.times().map(lambda t: t.strftime(f"%H:%M{':%S' if t.second % 2 else ''}")),
    st.tuples(st.text(max_size=8), st.sampled_from("'\"")).map(lambda t: _quoted(*t)),
)
_VALUES = st.one_of(_LITERALS, _PATHS)
_SPACE = st.sampled_from([" ", "\n  ", "  # note\n"])


def _predicates(values: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return predicates(values, _DURATIONS)


def _compound(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, _SPACE, st.sampled_from(["and", "or"]), _SPACE, inner).map("".join),
        inner.map(lambda c: f"not {c}"),
        inner.map(lambda c: f"({c})"),
        _predicates(inner.map(lambda c: f"({c})")),
    )


VALID_SOURCES = st.recursive(_predicates(_VALUES), _compound, max_leaves=12)

# --- contexts ----------------------------------------------------------------

_ZONES = st.sampled_from([datetime.UTC, datetime.timezone(datetime.timedelta(hours=5, minutes=30))])
_MOMENTS = st.datetimes(
    min_value=datetime.datetime(2000, 1, 1),
    max_value=datetime.datetime(2040, 1, 1),
    timezones=_ZONES,
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
    _MOMENTS.map(lambda m: m.isoformat()),
    st.times().map(lambda t: t.isoformat()),
)
JSON: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=10,
)
ANYTHING: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        _SCALARS,
        _MOMENTS,
        st.datetimes(timezones=st.none() | _ZONES).map(lambda m: m.isoformat()),
        st.times(timezones=st.none() | _ZONES),
        st.timedeltas(),
        st.binary(max_size=4),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=4),
    ),
    max_leaves=10,
)


def _contexts(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Context]:
    keys = st.sampled_from(["a", "b", "c", "items", "x"])
    return st.builds(
        lambda metadata, now, entered, previous, feed: Context(
            label="label",
            metadata=metadata,
            now=now,
            entered_state=entered,
            previous_state=previous,
            fetch_feed=FeedServer({"f": feed}),
        ),
        st.dictionaries(keys, values, max_size=5),
        _MOMENTS,
        st.none() | _MOMENTS,
        st.none() | st.text(max_size=5),
        st.dictionaries(keys, values, max_size=3),
    )


# --- properties --------------------------------------------------------------


@SETTINGS
@given(ARBITRARY_TEXT)
def test_compiling_any_text_gives_a_program_or_a_syntax_error(source: str) -> None:
    try:
        program = compile_condition(source)
    except ConditionSyntaxError as error:
        assert error.line >= 1 and error.column >= 1 and error.length >= 1
        assert str(error).startswith(f"Error on line {error.line}: {error.message}\n")
    else:
        assert isinstance(program, Program)


@SETTINGS
@given(VALID_SOURCES, _contexts(JSON))
def test_canonical_text_round_trips(source: str, context: Context) -> None:
    program = compile_condition(source)
    canonical = compile_condition(program.canonical())
    assert canonical.canonical() == program.canonical()
    assert canonical.paths == program.paths
    assert canonical.warnings == ()
    assert canonical.evaluate(context) == program.evaluate(context)


@SETTINGS
@given(VALID_SOURCES, _contexts(ANYTHING))
def test_evaluation_never_raises(source: str, context: Context) -> None:
    program = compile_condition(source)
    result = program.evaluate(context)
    assert isinstance(result, bool)
    explanation = program.explain(context)
    assert explanation.result is result
    json.dumps(explanation.to_json(), allow_nan=False)
