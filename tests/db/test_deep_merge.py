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
