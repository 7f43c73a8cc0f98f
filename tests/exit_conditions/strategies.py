"""Hypothesis strategies for the gate language's predicates (search expressions share them)."""

from __future__ import annotations

from hypothesis import strategies as st


def predicates(
    values: st.SearchStrategy[str], durations: st.SearchStrategy[str]
) -> st.SearchStrategy[str]:
    """One predicate over ``values``: a bare value, a comparison, ``is defined``, ``is in``,
    or ``<duration> has passed since <value>``."""
    return st.one_of(
        values,
        st.tuples(values, st.sampled_from(["=", "/=", "<", ">", "<=", ">="]), values).map(" ".join),
        st.tuples(values, st.sampled_from(["is defined", "is not defined"])).map(" ".join),
        st.tuples(values, st.sampled_from(["is in", "is not in"]), values).map(" ".join),
        st.tuples(
            durations, st.sampled_from(["has passed since", "has not passed since"]), values
        ).map(" ".join),
    )


MOMENT_VALUES = [
    "history.entered_state",
    "system.entered_state",
    "system.now",
    "metadata.m1",
    "metadata.m2",
    "metadata.junk",
    "'2024-03-31T01:30:00+01:00'",
]
TIME_VALUES = [
    "system.time",
    "18:30",
    "00:00",
    "01:30",
    "23:59:59",
    "metadata.t1",
    "metadata.t2",
    "metadata.junk",
]
DURATIONS = ["0s", "30m", "1h", "12h", "1d", "1d1h30m", "2d"]


def time_conditions(*, feeds: bool = True) -> st.SearchStrategy[str]:
    """Conditions over every time construct (and metadata, and a feed), combined with
    ``and``/``or``/``not`` and parentheses."""
    values = st.sampled_from([*MOMENT_VALUES, *TIME_VALUES, "metadata.flag"])
    leaves = st.one_of(
        predicates(values, st.sampled_from(DURATIONS)),
        st.sampled_from(
            [
                "system.now is in metadata.moments",
                "system.time is in metadata.times",
                "system.time is not in metadata.times",
                "(system.time >= 12:00) = metadata.flag",
                "metadata.flag",
            ]
            + (["feeds.f.x", "feeds.f.x > 2", "1h has passed since feeds.f.at"] if feeds else [])
        ),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(
                lambda parts: f"({parts[0]} {parts[1]} {parts[2]})"
            ),
            inner.map(lambda condition: f"not ({condition})"),
        ),
        max_leaves=4,
    )
