"""Bounded JSON parsing: the depth limit, unstorable strings, and no recursion doing it."""

from __future__ import annotations

from typing import Any

import pytest

from routemaster.limits import JSONRejected, check_json, parse_json


def test_depth_counts_containers_and_the_limit_is_inclusive() -> None:
    assert parse_json(b"[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(JSONRejected, match="limit of 2 levels"):
        parse_json(b"[[[1]]]", max_depth=2)
    assert parse_json(b'{"metadata": {"a": {}}}', max_depth=2, wrapper_levels=1)


def test_a_value_nested_a_million_deep_is_refused_without_recursion() -> None:
    value: Any = "leaf"
    for _ in range(1_000_000):
        value = {"k": value}
    with pytest.raises(JSONRejected, match="128"):
        check_json(value)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"k\\u0000": 1}', "\\u0000"),
        (b'["\\udc00"]', "unpaired surrogate"),
        (b'{"\\ud800": 1}', "unpaired surrogate"),
        (b"[Infinity]", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_what_postgresql_cannot_store_is_refused(raw: bytes, words: str) -> None:
    with pytest.raises(JSONRejected, match=words.replace("\\", "\\\\")):
        parse_json(raw)


def test_surrogate_pairs_are_ordinary_characters() -> None:
    assert parse_json(b'["\\ud83d\\ude00"]') == ["😀"]
