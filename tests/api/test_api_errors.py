"""Errors are JSON with the right status, and awkward names are just names."""

from __future__ import annotations

from urllib.parse import quote

import flask
import pytest
from flask.testing import FlaskClient

from tests.api.helpers import body

LABELS = "/state-machines/user/labels"


def label_url(name: str) -> str:
    return f"{LABELS}/{quote(name, safe='')}"


def test_body_that_is_not_json_is_400(client: FlaskClient) -> None:
    for data in (
        b"",
        b"{",
        b"not json",
        b"\xff\xfe\x00",
        b'{"metadata": NaN}',
        b'{"metadata": {"x": Infinity}}',
        b"[" * 100_000,
    ):
        response = client.post(label_url("a"), data=data, content_type="application/json")
        assert response.status_code == 400, data[:20]
        assert response.mimetype == "application/json"
        assert body(response)["message"]


def test_json_without_a_content_type_is_accepted(client: FlaskClient) -> None:
    response = client.post(label_url("a"), data=b'{"metadata": {"x": 1}}')
    assert response.status_code == 201


def test_metadata_postgresql_cannot_store_is_400_not_500(client: FlaskClient) -> None:
    response = client.post(label_url("a"), json={"metadata": {"x": "nul \u0000 inside"}})
    assert response.status_code == 400
    assert "database" in body(response)["message"]


@pytest.mark.parametrize("raw", [b'"nul \\u0000 inside"', b'"lone \\ud800 surrogate"'])
def test_strings_postgresql_cannot_store_are_400_on_patch_too(
    client: FlaskClient, raw: bytes
) -> None:
    client.post(label_url("a"), json={"metadata": {}})
    response = client.patch(label_url("a"), data=b'{"metadata": {"x": ' + raw + b"}}")
    assert response.status_code == 400
    assert "database" in body(response)["message"]
    assert body(client.get(label_url("a")))["metadata"] == {}


def test_body_over_the_limit_is_413(client: FlaskClient, flask_app: flask.Flask) -> None:
    limit = flask_app.extensions["routemaster"].settings.max_request_body
    big = b'{"metadata": {"x": "' + b"y" * limit + b'"}}'
    response = client.post(label_url("a"), data=big)
    assert response.status_code == 413
    assert body(response)["message"]
    just_under = b'{"metadata": {"x": "' + b"y" * (limit - 30) + b'"}}'
    assert client.post(label_url("a"), data=just_under).status_code == 201


def test_unknown_route_is_404_json(client: FlaskClient) -> None:
    response = client.get("/nowhere")
    assert response.status_code == 404
    assert response.mimetype == "application/json"
    assert body(response)["message"]


def test_wrong_method_is_405_json_with_allow(client: FlaskClient) -> None:
    response = client.put(label_url("a"), json={"metadata": {}})
    assert response.status_code == 405
    assert response.mimetype == "application/json"
    assert body(response)["message"]
    assert "PATCH" in response.headers["Allow"]


@pytest.mark.parametrize(
    "name",
    [
        "with space",
        "ünïcödé ✓ 名前",
        "slash/inside",
        "/leading",
        "trailing/",
        "a//b",
        "100%",
        "%2F",
        "%25",
        "plus+and&amp;?query#hash",
        ".",
        "..",
        "x" * 1024,
    ],
)
def test_odd_names_work_on_every_endpoint(client: FlaskClient, name: str) -> None:
    url = label_url(name)
    created = client.post(url, json={"metadata": {"n": name}})
    assert created.status_code == 201, body(created)
    assert body(client.get(url))["metadata"] == {"n": name}
    assert body(client.patch(url, json={"metadata": {"m": 1}}))["metadata"] == {"n": name, "m": 1}
    assert client.get(url + "/history").status_code == 200
    assert client.get(url + "/explain").status_code == 200
    assert {"name": name, "state": "start"} in body(client.get(LABELS))["labels"]
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 410


def test_percent_encoded_and_literal_names_are_different_labels(client: FlaskClient) -> None:
    assert client.post(label_url("a/b"), json={"metadata": {}}).status_code == 201
    assert client.get(label_url("a%2Fb")).status_code == 404
    assert client.get(f"{LABELS}/a/b").status_code == 404


def test_names_longer_than_1024_characters_are_400(client: FlaskClient) -> None:
    url = label_url("é" * 1025)
    for method in ("POST", "GET", "PATCH", "DELETE"):
        response = client.open(url, method=method, json={"metadata": {}})
        assert response.status_code == 400, method
        assert "1024" in body(response)["message"]


def test_empty_name_is_400(client: FlaskClient) -> None:
    response = client.post(f"{LABELS}/", json={"metadata": {}})
    assert response.status_code == 400
    assert "empty" in body(response)["message"]


def test_name_that_is_not_utf8_is_400(client: FlaskClient) -> None:
    response = client.get(f"{LABELS}/%FF%FE")
    assert response.status_code == 400
    assert body(response)["message"]


def test_name_with_nul_is_400(client: FlaskClient) -> None:
    assert client.post(f"{LABELS}/a%00b", json={"metadata": {}}).status_code == 400


@pytest.mark.parametrize("command", ["retry", "pause", "resume"])
def test_a_null_body_where_an_object_is_declared_is_400(client: FlaskClient, command: str) -> None:
    assert client.post(label_url("a"), json={"metadata": {}}).status_code == 201
    response = client.post(
        f"{label_url('a')}/{command}", data=b"null", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON object" in body(response)["message"]
    no_body = client.post(f"{label_url('a')}/resume")
    assert no_body.status_code in (200, 409)  # an empty body is still no body


@pytest.mark.parametrize(
    "path",
    [
        "/deliveries",
        "/history",
        "/explain",
        "/tasks",
        "/retry",
    ],
)
def test_every_label_path_checks_the_name_from_the_declaration(
    client: FlaskClient, path: str
) -> None:
    for name in ("x" * 1025, "a\x00b"):
        method = "POST" if path == "/retry" else "GET"
        response = client.open(label_url(name) + path, method=method)
        assert response.status_code == 400, (path, name[:5])
        assert body(response)["message"] == (
            "Label names are 1 to 1024 characters, without NUL characters."
        )


def test_the_label_name_rule_is_declared_in_the_document(client: FlaskClient) -> None:
    document = body(client.get("/openapi.json"))
    rule = document["components"]["schemas"]["LabelName"]
    assert rule["maxLength"] == 1024
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                if parameter["name"] == "label":
                    assert parameter["schema"] == {"$ref": "#/components/schemas/LabelName"}, path
