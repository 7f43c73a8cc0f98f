"""Request schemas compiled into plain checks: never more lenient than the validator.

A request the compiled check passes skips jsonschema altogether, so each
compiled schema is held against the validator on values shaped like what it
describes (right and wrong types, bounds either side, extra and missing
keys), and the label bodies every create and update sends must compile.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routemaster.webcore.request_checks import _FORMATS, COMPONENTS, _body_checks
from routemaster.webcore.schema_checks import compile_check

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([0, 1, -1, 0.0, 1.0, 3.0, 2.5, 86_400, 86_401, 10_000, 10_001]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.sampled_from(["", "x", "2026-11-24T12:00:00Z", "not a time", "move", "http://a/b"]),
)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


def near(schema: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values shaped like ``schema``, valid or just outside it, and sometimes anything."""
    if not isinstance(schema, dict) or depth > 4:
        return ANY_JSON
    target = schema.get("$ref")
    if isinstance(target, str):
        return near(COMPONENTS[target.rpartition("/")[2]], depth + 1)
    choices: list[st.SearchStrategy[Any]] = [SCALARS]
    for keyword in ("enum",):
        if keyword in schema:
            choices.append(st.sampled_from(list(schema[keyword])))
    if "const" in schema:
        choices.append(st.just(schema["const"]))
    for keyword in ("anyOf", "allOf", "oneOf"):
        for choice in schema.get(keyword, ()):
            choices.append(near(choice, depth + 1))
    for bound in ("minimum", "maximum", "minLength", "maxLength"):
        if bound in schema:
            limit = schema[bound]
            if "Length" in bound:
                choices.append(st.sampled_from(["a" * max(limit + d, 0) for d in (-1, 0, 1)]))
            else:
                choices.append(st.sampled_from([limit - 1, limit, limit + 1, float(limit)]))
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties:
        fields = {name: near(sub, depth + 1) for name, sub in properties.items()}
        choices.append(
            st.fixed_dictionaries({}, optional=fields).flatmap(
                lambda body: st.dictionaries(st.sampled_from(["extra"]), ANY_JSON, max_size=1).map(
                    lambda extra: {**body, **extra}
                )
            )
        )
        choices.append(st.fixed_dictionaries({}, optional=fields))
    items = schema.get("items")
    if isinstance(items, dict):
        choices.append(st.lists(near(items, depth + 1), max_size=3))
    return st.one_of(choices)


@pytest.mark.parametrize("name", sorted(COMPONENTS))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_compiled_schema_passes_nothing_the_validator_refuses(name: str, data: Any) -> None:
    checks = _body_checks(name)
    if checks.passes is None:
        return  # not compiled: the validator decides every request
    value = data.draw(near({"$ref": f"#/components/schemas/{name}"}))
    if checks.passes(value):
        assert checks.validator.is_valid(value), (name, value)


def test_the_label_bodies_and_task_requests_are_compiled() -> None:
    """The bodies sent most often skip the validator when valid."""
    for name in ("MetadataBody", "Claim", "Heartbeat", "Failure", "Completion", "Move"):
        assert _body_checks(name).passes is not None, name
    passes = _body_checks("MetadataBody").passes
    assert passes is not None
    assert passes({"metadata": {"go": True}})
    assert not passes({"metadata": []})
    assert not passes({})


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        ({"type": "integer"}, [3, 3.0, -1], [True, 2.5, "3", None]),
        ({"type": "number", "maximum": 10}, [10, 9.5], [10.5, False]),
        ({"enum": ["a", None]}, ["a", None], ["b", 0, False]),
        ({"const": "x"}, ["x"], ["y", None]),
        ({"type": "string", "pattern": "^a", "maxLength": 2}, ["a", "ab"], ["abc", "ba", 1]),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            [{"a": 1}, {"a": 1, "b": 2}],
            [{}, {"a": "1"}, []],
        ),
        (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
            [{}, {"a": [1]}],
            [{"b": 1}],
        ),
        ({"type": "string", "format": "date-time"}, ["2026-11-24T12:00:00Z"], ["soon"]),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, [1, None], ["1"]),
    ],
)
def test_compiled_keywords_decide_as_the_validator_does(
    schema: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    passes = compile_check(schema, COMPONENTS, _FORMATS)
    assert passes is not None
    assert [passes(value) for value in valid] == [True] * len(valid)
    assert [passes(value) for value in invalid] == [False] * len(invalid)


def test_keywords_it_does_not_know_leave_the_schema_to_the_validator() -> None:
    unknown: list[dict[str, Any]] = [{"not": {"type": "null"}}, {"if": {}}, {"oneOf": [{}]}]
    for schema in unknown:
        assert compile_check(schema, COMPONENTS, _FORMATS) is None
