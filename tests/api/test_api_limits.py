"""Hostile bodies and queries: a clear 4xx naming the limit, and nothing stored or broken."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routemaster.app import App
from routemaster.web import create_app
from tests.api.helpers import body

LABELS = "/state-machines/user/labels"
LABEL = LABELS + "/ann"
COMMANDS = ("retry", "pause", "resume", "move")


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` levels of alternating objects and lists around ``leaf``."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def metadata_of_depth(depth: int) -> dict[str, Any]:
    """An object nesting exactly ``depth`` levels (itself counted)."""
    return {"a": nested(depth - 1)} if depth > 1 else {}


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_metadata_at_the_depth_limit_is_stored_and_one_deeper_is_400(
    client: FlaskClient, method: str
) -> None:
    if method == "PATCH":
        client.post(LABEL, json={"metadata": {}})
    deepest = metadata_of_depth(128)
    response = client.open(LABEL, method=method, json={"metadata": deepest})
    assert response.status_code in (200, 201), body(response)
    assert body(client.get(LABEL))["metadata"] == deepest
    assert client.get(LABEL + "/explain").status_code == 200

    too_deep = client.open(LABEL, method=method, json={"metadata": metadata_of_depth(129)})
    assert too_deep.status_code == 400
    assert "128" in body(too_deep)["message"]
    assert body(client.get(LABEL))["metadata"] == deepest


@pytest.mark.parametrize("depth", [129, 960, 5_000, 200_000])
def test_any_deeper_body_is_400_and_the_label_stays_readable(
    client: FlaskClient, depth: int
) -> None:
    client.post(LABEL, json={"metadata": {"x": 1}})
    raw = b'{"metadata": {"a": ' + b"[" * depth + b"]" * depth + b"}}"
    for method in ("POST", "PATCH"):
        response = client.open(LABEL, method=method, data=raw)
        assert response.status_code == 400, (method, depth)
        assert "128 levels" in body(response)["message"]
    assert body(client.get(LABEL))["metadata"] == {"x": 1}
    assert client.get(LABEL + "/explain").status_code == 200


def test_the_depth_limit_is_a_setting(app: App) -> None:
    small = create_app(
        dataclasses.replace(app, settings=dataclasses.replace(app.settings, max_json_depth=3))
    ).test_client()
    assert small.post(LABEL, json={"metadata": metadata_of_depth(3)}).status_code == 201
    response = small.patch(LABEL, json={"metadata": metadata_of_depth(4)})
    assert response.status_code == 400
    assert "limit of 3 levels" in body(response)["message"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"reason": "nul \\u0000 inside", "state": "done"}', "\\u0000"),
        (b'{"reason": "lone \\ud800", "state": "done"}', "surrogate"),
        (b'{"reason": "lone \\udfff low", "state": "done"}', "surrogate"),
        (b'{"state": "done", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "128 levels"),
        (b'{"state": "done", "x": ' + b"[" * 200 + b"]" * 200 + b"}", "128 levels"),
        (b'{"state": "done", "reason": NaN}', "not valid JSON"),
    ],
)
def test_command_bodies_that_cannot_be_stored_are_400(
    client: FlaskClient, command: str, raw: bytes, words: str
) -> None:
    client.post(LABEL, json={"metadata": {}})
    before = body(client.get(LABEL + "/history"))["history"]
    response = client.post(f"{LABEL}/{command}", data=raw, content_type="application/json")
    assert response.status_code == 400
    assert words in body(response)["message"]
    assert body(client.get(LABEL + "/history"))["history"] == before


def test_a_command_reason_in_any_script_is_recorded(client: FlaskClient) -> None:
    client.post(LABEL, json={"metadata": {}})
    reason = "😀 文 é \U0010ffff surrogate pair \ud83d\ude00 is fine"
    raw = json.dumps({"reason": reason}).encode()  # ASCII, with escaped surrogate pairs
    assert client.post(LABEL + "/pause", data=raw).status_code == 200
    assert (
        body(client.get(LABEL + "/history"))["history"][-1]["reason"] == json.loads(raw)["reason"]
    )


# Any JSON document: accepted exactly when it is an object with an object
# under "metadata", nesting no deeper than the limit, with storable strings.
any_text = st.text(max_size=4)
json_documents = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | any_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(any_text, children, max_size=3)
    ),
    max_leaves=12,
)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def storable(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return all(storable(k) and storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(map(storable, value))
    return True


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    document=json_documents | st.fixed_dictionaries({"metadata": json_documents}),
    wrap=st.integers(0, 3),
)
def test_any_body_shape_is_created_or_refused_with_400(app: App, document: Any, wrap: int) -> None:
    limited = dataclasses.replace(app, settings=dataclasses.replace(app.settings, max_json_depth=4))
    client = create_app(limited).test_client()
    with app.db.begin() as conn:
        conn.execute(sa.text("TRUNCATE labels, history"))
    for _ in range(wrap):  # push it towards and past the limit
        if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
            document = {"metadata": {"w": document["metadata"]}}
    raw = json.dumps(document).encode()
    response = client.post(LABEL, data=raw)
    metadata = document.get("metadata") if isinstance(document, dict) else None
    acceptable = isinstance(metadata, dict) and depth(metadata) <= 4 and storable(document)
    if acceptable:
        assert response.status_code == 201, body(response)
        assert body(client.get(LABEL))["metadata"] == metadata
    else:
        assert response.status_code == 400, document
        assert body(response)["message"]
        assert client.get(LABEL).status_code == 404


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("?stat=start", "stat"),
        ("?limit=10&sate=start", "sate"),
        ("?state=start&state=done", "state"),
        ("?limit=abc", "limit"),
        ("?limit=0", "limit"),
        ("?after=%00", "after"),
    ],
)
def test_listing_with_unknown_or_malformed_parameters_is_400_naming_it(
    client: FlaskClient, query: str, named: str
) -> None:
    response = client.get(LABELS + query)
    assert response.status_code == 400
    assert named in body(response)["message"]


def test_machine_listing_takes_no_parameters(client: FlaskClient) -> None:
    response = client.get("/state-machines?verbose=1")
    assert response.status_code == 400
    assert "verbose" in body(response)["message"]
    assert client.get("/state-machines").status_code == 200


def test_listing_with_known_parameters_still_works(client: FlaskClient) -> None:
    client.post(LABEL, json={"metadata": {}})
    response = client.get(LABELS + "?state=start&limit=5&after=")
    assert response.status_code == 200
    assert body(response)["labels"] == [{"name": "ann", "state": "start"}]


# Label names: any non-empty text up to 1,024 characters without NUL (URLs carry
# UTF-8, so no lone surrogates), however many bytes of UTF-8 that makes.
label_names = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    min_size=1,
    max_size=1024,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=label_names)
def test_any_label_name_works_on_every_endpoint(app: App, name: str) -> None:
    client = create_app(app).test_client()
    with app.db.begin() as conn:
        conn.execute(sa.text("TRUNCATE labels, history"))
    url = f"{LABELS}/{quote(name, safe='')}"
    assert client.post(url, json={"metadata": {"n": name}}).status_code == 201
    assert body(client.get(url))["metadata"] == {"n": name}
    assert client.patch(url, json={"metadata": {"m": 1}}).status_code == 200
    assert client.post(url + "/pause", json={"reason": name}).status_code == 200
    assert client.get(url + "/explain").status_code == 200
    assert body(client.get(LABELS))["labels"] == [{"name": name, "state": "start"}]
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 410


@pytest.mark.parametrize(
    ("low", "high"), [(0x4E00, 0x9FFF), (0x10000, 0x10FFFF)], ids=["3-byte", "4-byte"]
)
def test_a_name_too_large_for_a_btree_index_entry_is_a_label(
    client: FlaskClient, low: int, high: int
) -> None:
    """1,024 varied characters (3-4 KiB that do not compress) are indexed by key, not whole."""
    name = "".join(chr(random.randint(low, high)) for _ in range(1024))
    url = f"{LABELS}/{quote(name, safe='')}"
    created = client.post(url, json={"metadata": {"n": 1}})
    assert created.status_code == 201, created.get_data(as_text=True)[:300]
    assert body(client.get(url))["metadata"] == {"n": 1}
    assert client.post(url, json={"metadata": {}}).status_code == 409
    assert body(client.get(LABELS))["labels"] == [{"name": name, "state": "start"}]
