"""The SQL deep merge behind PATCH agrees with the documented rule on any JSON."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# PostgreSQL cannot store NUL or lone surrogates in jsonb text (the API answers
# 400 for them), so the property is about every other string.
text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=5,
)
scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | text
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(text, json_values, max_size=4)


def documented_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """SPEC A2: nested objects merge key by key; any other value replaces."""
    merged = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = documented_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=json_objects, patch=json_objects)
def test_sql_merge_matches_the_documented_rule(
    db_engine: sa.Engine, base: dict[str, Any], patch: dict[str, Any]
) -> None:
    with db_engine.connect() as conn:
        merged = conn.execute(
            sa.text("SELECT routemaster_deep_merge(CAST(:a AS jsonb), CAST(:b AS jsonb))"),
            {"a": json.dumps(base), "b": json.dumps(patch)},
        ).scalar_one()
    assert merged == documented_merge(base, patch)


# Patches and stored values that share structure, so the merge recurses: the
# same few keys at every level, objects nested several levels deep.
shared_keys = st.sampled_from(["a", "b", "c"])
overlapping = st.recursive(
    scalars | st.lists(scalars, max_size=2),
    lambda children: st.dictionaries(shared_keys, children, max_size=3),
    max_leaves=25,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    base=st.dictionaries(shared_keys, overlapping, max_size=3),
    patch=st.dictionaries(shared_keys, overlapping, max_size=3),
)
def test_sql_merge_matches_the_rule_on_overlapping_nested_objects(
    db_engine: sa.Engine, base: dict[str, Any], patch: dict[str, Any]
) -> None:
    with db_engine.connect() as conn:
        merged = conn.execute(
            sa.text("SELECT routemaster_deep_merge(CAST(:a AS jsonb), CAST(:b AS jsonb))"),
            {"a": json.dumps(base), "b": json.dumps(patch)},
        ).scalar_one()
    assert merged == documented_merge(base, patch)


def chain(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    value = leaf
    for level in range(depth - 1):
        value = {"a": value, f"side{level}": level}
    return value


def test_merge_at_the_metadata_depth_limit_works(db_engine: sa.Engine) -> None:
    """128 levels merging all the way down stays within PostgreSQL's stack."""
    base, patch = chain(128, {"x": 1}), chain(128, {"y": 2})
    with db_engine.connect() as conn:
        merged = conn.execute(
            sa.text("SELECT routemaster_deep_merge(CAST(:a AS jsonb), CAST(:b AS jsonb))"),
            {"a": json.dumps(base), "b": json.dumps(patch)},
        ).scalar_one()
    assert merged == documented_merge(base, patch)


def test_merge_of_many_keys_is_one_pass_not_one_copy_per_key(db_engine: sa.Engine) -> None:
    """20,000 keys into 20,000: the quadratic merge took tens of seconds here.

    Not a timing assertion: the statement timeout of 5 s cuts off a merge
    that copies the object per key, and the test then fails with the error.
    """
    stored = {f"k{i}": {"m": i} for i in range(20_000)}
    patch = {f"k{i}": ({"n": i} if i % 2 else i) for i in range(20_000)}
    with db_engine.connect() as conn:
        conn.execute(sa.text("SET LOCAL statement_timeout = '5s'"))
        merged = conn.execute(
            sa.text("SELECT routemaster_deep_merge(CAST(:a AS jsonb), CAST(:b AS jsonb))"),
            {"a": json.dumps(stored), "b": json.dumps(patch)},
        ).scalar_one()
    assert merged == documented_merge(stored, patch)
