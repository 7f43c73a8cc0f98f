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
