"""Create, read, update and delete of one label, dispatched by Flask like every request.

Every answer these endpoints have (successes and each error), the hooks and
signal receivers a plugin may register seeing them, and the token check and
request metrics (both registered as Flask hooks) applying to them.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from werkzeug.test import TestResponse

from routemaster import service
from routemaster.api.auth import token_cache
from routemaster.app import App, Settings
from routemaster.auth.admin import create_token
from routemaster.config import load_config
from routemaster.config.model import Config
from routemaster.db.plumbing.database import create_engine
from routemaster.metrics import Metrics
from routemaster.web import create_app
from tests.api.conftest import CONFIG_PATH
from tests.api.tokens import tokens_layer
from tests.metrics.test_metrics import scrape, value

LABELS = "/state-machines/user/labels"
NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
LIMIT = 200  # bytes: a small body limit, so 413s are cheap to provoke

# (method, path, keyword arguments of the test client's open(), the status answered)
Request = tuple[str, str, dict[str, Any], int]
SCRIPT: list[Request] = [
    ("POST", f"{LABELS}/alice", {"json": {"metadata": {"a": 1, "n": {"x": [1, "é"]}}}}, 201),
    ("POST", f"{LABELS}/alice", {"json": {"metadata": {}}}, 409),
    ("GET", f"{LABELS}/alice", {}, 200),
    ("GET", f"{LABELS}/alice?ignored=1", {}, 200),
    ("PATCH", f"{LABELS}/alice", {"json": {"metadata": {"n": {"y": None}}}}, 200),
    ("PATCH", f"{LABELS}/alice", {"json": {"metadata": {"ready": True}}}, 200),  # moves it
    ("POST", f"{LABELS}/a%2Fb%20c", {"json": {"metadata": {}}}, 201),
    ("GET", f"{LABELS}/a%2Fb%20c", {}, 200),
    ("GET", f"{LABELS}/caf%C3%A9", {}, 404),  # a UTF-8 name
    ("GET", f"{LABELS}/%FF", {}, 400),  # not UTF-8
    ("GET", f"{LABELS}/a%00b", {}, 400),  # NUL
    ("GET", f"{LABELS}/" + "x" * 1025, {}, 400),  # too long
    ("GET", "/state-machines/nope/labels/alice", {}, 404),  # no such machine
    ("PATCH", "/state-machines/nope/labels/alice", {"data": b"not json"}, 404),  # before 400
    ("GET", "/state-machines/caf%FF/labels/alice", {}, 400),  # the machine's name
    ("POST", f"{LABELS}/bob", {"data": b"{not json"}, 400),
    ("POST", f"{LABELS}/bob", {"data": b"[1]"}, 400),
    ("POST", f"{LABELS}/bob", {"data": b'{"x": {}}'}, 400),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": 3}'}, 400),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": {"x": NaN}}'}, 400),
    ("POST", f"{LABELS}/bob", {"data": b""}, 400),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": {"x": "' + b"y" * LIMIT + b'"}}'}, 413),
    (
        "POST",  # a chunked body (no Content-Length) over the limit: 413 as well
        f"{LABELS}/bob",
        {
            "input_stream": io.BytesIO(b'{"metadata": {"x": "' + b"y" * LIMIT + b'"}}'),
            "environ_overrides": {"wsgi.input_terminated": True},
        },
        413,
    ),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": {"x": "\\u0000"}}'}, 400),  # db refuses
    ("PATCH", f"{LABELS}/nobody", {"json": {"metadata": {}}}, 404),
    ("DELETE", f"{LABELS}/nobody", {}, 204),  # all the same
    ("DELETE", f"{LABELS}/alice", {}, 204),
    ("GET", f"{LABELS}/alice", {}, 410),
    ("PATCH", f"{LABELS}/alice", {"json": {"metadata": {}}}, 410),
    ("DELETE", f"{LABELS}/alice", {}, 204),
    ("POST", f"{LABELS}/alice", {"json": {"metadata": {}}}, 409),  # deleted names stay taken
    ("DELETE", "/state-machines/nope/labels/alice", {}, 404),
    ("PUT", f"{LABELS}/a%2Fb%20c", {"json": {"metadata": {}}}, 405),
    ("POST", f"{LABELS}/", {"json": {"metadata": {}}}, 400),  # an empty name
]


def _app(engine: sa.Engine, config: Config, *, metrics: Metrics | None = None) -> flask.Flask:
    app = App(
        config=config,
        db=engine,
        settings=Settings(max_request_body=LIMIT, token_use_interval=3600),
        clock=lambda: NOW,
        direct=engine,
        metrics=metrics,
    )
    return create_app(app)


def _send(flask_app: flask.Flask, script: list[Request]) -> list[TestResponse]:
    client = flask_app.test_client()
    answers = []
    for method, path, kwargs, _ in script:
        if "input_stream" in kwargs:
            kwargs["input_stream"].seek(0)
        answers.append(client.open(path, method=method, **kwargs))
    return answers


def test_every_answer_of_the_label_endpoints(db_engine: sa.Engine, config: Config) -> None:
    answers = _send(_app(db_engine, config), SCRIPT)
    assert [a.status_code for a in answers] == [status for *_, status in SCRIPT]
    for (method, path, _, status), answer in zip(SCRIPT, answers, strict=True):
        if status == 204:
            assert answer.data == b""
            continue
        assert answer.content_type == "application/json", (method, path)
        if status >= 400:
            assert json.loads(answer.data)["message"], (method, path)
    assert json.loads(answers[5].data)["state"] != json.loads(answers[4].data)["state"]
    assert answers[32].headers["Allow"]


def test_a_database_outage_is_503_for_each_of_the_four(config: Config) -> None:
    unreachable = create_engine("postgresql://postgres@127.0.0.1:9/none", pool_size=1)
    script: list[Request] = [
        ("GET", f"{LABELS}/a", {}, 503),
        ("POST", f"{LABELS}/a", {"json": {"metadata": {}}}, 503),
        ("PATCH", f"{LABELS}/a", {"json": {"metadata": {}}}, 503),
        ("DELETE", f"{LABELS}/a", {}, 503),
    ]
    answers = _send(_app(unreachable, config), script)
    assert [(a.status_code, a.json) for a in answers] == [
        (503, {"message": "Cannot connect to database"})
    ] * 4
    unreachable.dispose()


def test_hooks_and_signal_receivers_a_plugin_registers_see_label_requests(
    db_engine: sa.Engine, config: Config
) -> None:
    flask_app = _app(db_engine, config)

    @flask_app.after_request
    def stamp(response: flask.Response) -> flask.Response:
        response.headers["X-Seen"] = flask.request.method
        return response

    def count(response: flask.Response) -> flask.Response:
        response.headers["X-Labels"] = "1"
        return response

    flask_app.after_request_funcs.setdefault("labels", []).append(count)  # the blueprint's
    client = flask_app.test_client()
    created = client.post(f"{LABELS}/a", json={"metadata": {}})
    assert (created.headers["X-Seen"], created.headers["X-Labels"]) == ("POST", "1")
    assert client.get(f"{LABELS}/a").headers["X-Seen"] == "GET"
    assert client.patch(f"{LABELS}/a", json={"metadata": {}}).headers["X-Seen"] == "PATCH"

    started: list[str] = []

    def record(sender: flask.Flask, **extra: Any) -> None:
        started.append(flask.request.path)

    with flask.request_started.connected_to(record, flask_app):
        client.delete(f"{LABELS}/a")
    assert started == [f"{LABELS}/a"]


def test_an_unexpected_error_is_a_json_500_logged_with_its_traceback(
    db_engine: sa.Engine,
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "get_label", broken)
    with caplog.at_level(logging.ERROR):
        answer = _app(db_engine, config).test_client().get(f"{LABELS}/a")
    assert (answer.status_code, answer.json) == (500, {"message": "Internal server error."})
    assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)


def test_with_tokens_label_requests_get_401_and_403_and_are_counted(
    db_engine: sa.Engine, tmp_path: Path
) -> None:
    layer = tokens_layer(tmp_path)
    flask_app = _app(db_engine, load_config([CONFIG_PATH, layer]), metrics=Metrics())
    cache = token_cache(flask_app)
    assert cache is not None and cache.wait_until_current(10)
    try:
        writer, _ = create_token(db_engine, "writer", {"read", "write"}, wait=10, direct=db_engine)
        reader, _ = create_token(db_engine, "reader", {"read"}, wait=10, direct=db_engine)
        client = flask_app.test_client()

        def send(method: str, who: str | None, **kwargs: Any) -> int:
            headers = {"Authorization": f"Bearer {who}"} if who else {}
            response = client.open(f"{LABELS}/a", method=method, headers=headers, **kwargs)
            return response.status_code

        body: dict[str, Any] = {"json": {"metadata": {}}}
        assert send("POST", None, **body) == 401
        assert send("POST", "nope", **body) == 401
        assert send("POST", reader.secret, **body) == 403
        assert send("POST", writer.secret, **body) == 201
        assert send("GET", reader.secret) == 200
        assert send("PATCH", reader.secret, **body) == 403
        assert send("PATCH", writer.secret, **body) == 200
        assert send("DELETE", writer.secret) == 204
        samples = scrape(client)
        endpoint = "/state-machines/{sm}/labels/{label}"
        requests = "routemaster_http_requests_total"
        assert value(samples, requests, method="POST", endpoint=endpoint, status="401") == 2
        assert value(samples, requests, method="POST", endpoint=endpoint, status="403") == 1
        assert value(samples, requests, method="POST", endpoint=endpoint, status="201") == 1
        assert value(samples, requests, method="GET", endpoint=endpoint, status="200") == 1
    finally:
        cache.close()
