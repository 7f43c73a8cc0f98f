"""``GET /openapi.json``: a valid OpenAPI 3.1 document of every endpoint, and true.

Truth is checked where responses happen: the API tests' client validates
each response against the document (:mod:`tests.api.openapi_check`). Here:
the document is valid, complete, describes authentication when it is on,
and the check does catch a response that drifted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flask
import pytest
from flask.testing import FlaskClient
from openapi_spec_validator import validate

from routemaster.api.auth import token_cache
from routemaster.api.openapi import build_document, openapi_path
from routemaster.app import App
from routemaster.config import load_config
from routemaster.metrics import Metrics
from routemaster.web import create_app
from tests.api.conftest import CONFIG_PATH
from tests.api.helpers import body
from tests.api.openapi_check import CheckedClient, Mismatch, check_response
from tests.api.tokens import tokens_layer

LABEL = "/state-machines/{sm}/labels/{label}"


def _document(flask_app: flask.Flask) -> dict[str, Any]:
    with flask_app.app_context():
        return build_document(flask_app)


def test_the_document_is_valid_openapi_and_served(client: FlaskClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    document = body(response)
    validate(document)
    assert document["openapi"] == "3.1.0"


def test_every_route_is_in_the_document(flask_app: flask.Flask) -> None:
    document = _document(flask_app)
    paths = document["paths"]
    assert isinstance(paths, dict)
    for rule in flask_app.url_map.iter_rules():
        for method in rule.methods or ():
            if method not in {"HEAD", "OPTIONS"}:
                assert method.lower() in paths[openapi_path(rule.rule)], (method, rule.rule)
    expected = {
        "/": ["get"],
        "/openapi.json": ["get"],
        "/state-machines": ["get"],
        "/state-machines/{sm}": ["get"],
        "/state-machines/{sm}/labels": ["get"],
        LABEL: ["delete", "get", "patch", "post"],
        LABEL + "/history": ["get"],
        LABEL + "/explain": ["get"],
        LABEL + "/retry": ["post"],
        LABEL + "/pause": ["post"],
        LABEL + "/resume": ["post"],
        LABEL + "/move": ["post"],
        "/state-machines/{sm}/bulk": ["post"],
        "/bulk/{job}": ["get"],
        "/changes": ["get"],
        "/state-machines/{sm}/changes": ["get"],
        "/console/": ["get"],
        "/console/machines/{sm}/labels/{label}/{command}": ["post"],
        "/console/login": ["get", "post"],
    }
    for path, methods in expected.items():
        assert sorted(paths[path]) == methods, path
    listing = paths["/state-machines/{sm}/labels"]["get"]
    assert {p["name"] for p in listing["parameters"] if p["in"] == "query"} == {
        "state",
        "limit",
        "after",
        "errored",
        "prefix",
        "where",
        "count",
    }
    stream = paths["/changes"]["get"]["responses"]["200"]["content"]
    assert list(stream) == ["text/event-stream"]
    create = paths[LABEL]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MetadataBody"
    }
    assert {"201", "400", "404", "409", "413", "default"} <= set(create["responses"])


@pytest.fixture
def secured_app(app: App, tmp_path: Path) -> Iterator[flask.Flask]:
    layer = tokens_layer(tmp_path)
    config = load_config([CONFIG_PATH, layer])
    flask_app = create_app(App(config=config, db=app.db, settings=app.settings, metrics=Metrics()))
    flask_app.test_client_class = CheckedClient
    yield flask_app
    cache = token_cache(flask_app)
    assert cache is not None
    cache.close()


def test_with_tokens_the_document_names_the_scheme_and_each_scope(
    secured_app: flask.Flask,
) -> None:
    document = _document(secured_app)
    validate(document)
    scheme = document["components"]["securitySchemes"]["bearerToken"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    paths = document["paths"]
    scopes = {
        (path, method): operation["security"]
        for path, item in paths.items()
        for method, operation in item.items()
    }
    assert scopes[("/", "get")] == [{}]
    assert scopes[("/metrics", "get")] == [{}]
    assert scopes[(LABEL, "get")] == [{"bearerToken": ["read"]}]
    assert scopes[(LABEL, "post")] == [{"bearerToken": ["write"]}]
    assert scopes[(LABEL + "/move", "post")] == [{"bearerToken": ["operate"]}]
    assert {"401", "403"} <= set(paths[LABEL]["get"]["responses"])
    assert "401" not in paths["/"]["get"]["responses"]


def test_the_check_catches_a_response_the_document_does_not_describe(
    flask_app: flask.Flask,
) -> None:
    document = _document(flask_app)
    label = (
        b'{"metadata":{},"state":"start","state_entered_at":null,"paused":false,'
        b'"errored":false,"last_error":null,"version":null}'
    )
    path = "/state-machines/user/labels/a%2Fb"
    check_response(document, "GET", path, 200, "application/json", label)
    with pytest.raises(Mismatch, match="'state' is a required property"):
        check_response(document, "GET", path, 200, "application/json", b'{"metadata":{}}')
    with pytest.raises(Mismatch, match="Additional properties"):
        check_response(document, "GET", path, 200, "application/json", label[:-1] + b',"x":1}')
    with pytest.raises(Mismatch, match="content type"):
        check_response(document, "GET", path, 200, "text/html", b"<html>")
    with pytest.raises(Mismatch, match="not in the document"):
        check_response(document, "GET", "/nowhere", 200, "application/json", b"{}")
    with pytest.raises(Mismatch, match="does not match"):
        check_response(document, "GET", path, 404, "application/json", b'{"error": "x"}')
