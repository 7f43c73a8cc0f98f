"""Property: a search selects exactly the labels for which the gate evaluator says true.

Generated expressions over generated labels (metadata, time entered, previous
state) on the real PostgreSQL. Each label is read back from the database for
the evaluator, so both sides see the metadata as stored (jsonb normalises
numbers). An expression the search refuses must be refused for a reason the
search documents, never silently answered differently.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routemaster.db.search import Search, search_count, search_page
from routemaster.exit_conditions import ConditionSyntaxError, Context, compile_condition
from routemaster.search import compile_search
from tests.exit_conditions.strategies import predicates

NOW = datetime.datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=datetime.UTC)
MACHINE = "search-properties"

REFUSALS = ("cannot compare metadata with a time", "numbers with a fraction only below")

_COMMON = [0, 1, 1.0, -0.0, 2.5, 10**20, "", "a", "b", "1", "ab", "start", True, False, None]
_SCALARS = st.one_of(
    st.sampled_from(_COMMON),
    st.sampled_from(_COMMON),
    st.sampled_from(_COMMON),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet="abé🙂Z\"'\\ ", max_size=4),
    st.just("2026-11-24T11:00:00+00:00"),
)
JSON: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c", "0", "1"]), inner, max_size=3),
    ),
    max_leaves=8,
)
METADATA = st.dictionaries(st.sampled_from(["a", "b", "c", "items", "x"]), JSON, max_size=4)
LABEL = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            "a": _SCALARS,
            "b": JSON,
            "items": st.lists(_SCALARS, max_size=3),
            "x": JSON,
        },
    )
    | METADATA,
    st.integers(0, 3 * 86400),  # seconds ago it entered its state
    st.none() | st.sampled_from(["start", "a", "1"]),
)

_PATHS = st.sampled_from(
    [
        "metadata.a",
        "metadata.b",
        "metadata.b.c",
        "metadata.b.0",
        "metadata.items",
        "metadata.items.1",
        "metadata.x.a.b",
        "history.entered_state",
        "history.previous_state",
        "history.current_state",
        "system.label",
        "system.now",
    ]
)
_LITERALS = st.one_of(
    st.sampled_from(
        ["true", "false", "null", "0", "1", "1.0", "-0.0", "2.5", "100000000000000000000"]
    ),
    st.sampled_from(['""', '"a"', '"b"', '"ab"', "'1'", '"start"', '"l1"', "'é'", '"\\""']),
    st.sampled_from(['"2026-11-24T11:00:00+00:00"', '"2026-11-23"', "1h", "1d", "12:30"]),
    st.integers(-5, 5).map(str),
)
_VALUES = st.one_of(_PATHS, _LITERALS)
_DURATIONS = st.sampled_from(["0s", "30m", "1h", "1d", "2d12h", "99999999d"])


def _predicates(values: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return predicates(values, _DURATIONS)


def _compound(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(
            lambda t: f"({t[0]}) {t[1]} ({t[2]})"
        ),
        inner.map(lambda c: f"not ({c})"),
        _predicates(inner.map(lambda c: f"({c})")),
    )


_FOCUSED = st.one_of(
    st.tuples(
        st.sampled_from(["metadata.a", "metadata.b", "metadata.items.0", "metadata.x"]),
        st.sampled_from(["=", "/=", "<", ">", "<=", ">="]),
        _LITERALS,
    ).map(" ".join),
    st.tuples(_LITERALS, st.sampled_from(["is in", "is not in"])).map(
        lambda t: f"{t[0]} {t[1]} metadata.items"
    ),
    st.tuples(st.sampled_from(["metadata.a", "metadata.b"]), st.sampled_from(["=", "<", ">="])).map(
        lambda t: f"{t[0]} {t[1]} metadata.items.0"
    ),
    st.sampled_from(["metadata.a", "metadata.b", "metadata.x.a"]).map(lambda p: f"{p} is defined"),
    _DURATIONS.map(lambda d: f"{d} has passed since history.entered_state"),
)
SOURCES = st.recursive(_FOCUSED | _predicates(_VALUES), _compound, max_leaves=6)


def _store(conn: sa.Connection, labels: list[tuple[dict[str, Any], int, str | None]]) -> None:
    conn.execute(sa.text("DELETE FROM labels WHERE state_machine = :sm"), {"sm": MACHINE})
    for index, (metadata, ago, previous) in enumerate(labels):
        conn.execute(
            sa.text(
                "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at,"
                " entry_id, previous_state, name_key, shard_key)"
                " VALUES (:sm, :name, CAST(:metadata AS jsonb), :state, :entered, 1, :previous,"
                " routemaster_label_key(:name), routemaster_shard_key(:name))"
            ),
            {
                "sm": MACHINE,
                "name": f"l{index}",
                "metadata": json.dumps(metadata),
                "state": "start" if index % 2 else "end",
                "entered": NOW - datetime.timedelta(seconds=ago),
                "previous": previous,
            },
        )


def _contexts(conn: sa.Connection) -> dict[str, Context]:
    rows = conn.execute(
        sa.text(
            "SELECT name, metadata, state, state_entered_at, previous_state FROM labels"
            " WHERE state_machine = :sm"
        ),
        {"sm": MACHINE},
    )
    return {
        row.name: Context(
            label=row.name,
            metadata=row.metadata,
            now=NOW,
            entered_state=row.state_entered_at,
            previous_state=row.previous_state,
            current_state=row.state,
        )
        for row in rows
    }


def _agrees(conn: sa.Connection, source: str, contexts: dict[str, Context]) -> None:
    program = compile_condition(source)
    try:
        compiled = compile_search(source, NOW)
    except ConditionSyntaxError as error:
        assert any(reason in error.message for reason in REFUSALS), error.message
        return
    search = Search(MACHINE, compiled.sql, compiled.params)
    found = {name for name, _ in search_page(conn, search, after="", limit=1000)}
    expected = {name for name, context in contexts.items() if program.evaluate(context)}
    assert found == expected, (source, compiled.sql, compiled.params)
    assert search_count(conn, search) == len(expected)


@pytest.mark.filterwarnings("ignore")
@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    labels=st.lists(LABEL, min_size=3, max_size=8),
    sources=st.lists(SOURCES, min_size=1, max_size=5),
)
def test_a_search_selects_the_labels_a_gate_would_pass(
    db_engine: sa.Engine, labels: list[tuple[dict[str, Any], int, str | None]], sources: list[str]
) -> None:
    with db_engine.begin() as conn:
        _store(conn, labels)
        contexts = _contexts(conn)
        for source in sources:
            _agrees(conn, source, contexts)
