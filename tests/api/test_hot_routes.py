"""The direct dispatch of the label endpoints answers exactly as Flask does, and steps aside.

Every request of a script (successes, every error the four endpoints have,
and neighbours that must stay Flask's) is sent once through an app with the
direct dispatch and once through one without, on the same emptied
database with the same clock: status, headers and body must be equal.
"""

from __future__ import annotations

import datetime
import io
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from werkzeug.test import TestResponse

from routemaster import labels as label_service
from routemaster.api import RoutemasterFlask, create_app, hot
from routemaster.api.auth import token_cache
from routemaster.api.responses import json_response
from routemaster.app import App, Settings
from routemaster.auth.admin import create_token
from routemaster.config import load_config
from routemaster.config.model import Config
from routemaster.db.database import create_engine
from routemaster.metrics import Metrics
from tests.api.conftest import CONFIG_PATH

LABELS = "/state-machines/user/labels"
NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
LIMIT = 200  # bytes: a small body limit, so 413s are cheap to provoke

# (method, path, keyword arguments of the test client's open())
Request = tuple[str, str, dict[str, Any]]
SCRIPT: list[Request] = [
    ("POST", f"{LABELS}/alice", {"json": {"metadata": {"a": 1, "n": {"x": [1, "é"]}}}}),
    ("POST", f"{LABELS}/alice", {"json": {"metadata": {}}}),  # 409
    ("GET", f"{LABELS}/alice", {}),
    ("GET", f"{LABELS}/alice?ignored=1", {}),
    ("PATCH", f"{LABELS}/alice", {"json": {"metadata": {"n": {"y": None}}}}),
    ("PATCH", f"{LABELS}/alice", {"json": {"metadata": {"ready": True}}}),  # moves the label
    ("GET", f"{LABELS}/alice", {}),
    ("POST", f"{LABELS}/a%2Fb%20c", {"json": {"metadata": {}}}),
    ("GET", f"{LABELS}/a%2Fb%20c", {}),
    ("GET", f"{LABELS}/caf%C3%A9", {}),  # 404, a UTF-8 name
    ("GET", f"{LABELS}/%FF", {}),  # 400, not UTF-8
    ("GET", f"{LABELS}/a%00b", {}),  # 400, NUL
    ("GET", f"{LABELS}/" + "x" * 1025, {}),  # 400, too long
    ("GET", "/state-machines/nope/labels/alice", {}),  # 404, no such machine
    ("PATCH", "/state-machines/nope/labels/alice", {"data": b"not json"}),  # 404 before 400
    ("GET", "/state-machines/caf%FF/labels/alice", {}),  # 400 from decoding the machine
    ("POST", f"{LABELS}/bob", {"data": b"{not json"}),
    ("POST", f"{LABELS}/bob", {"data": b"[1]"}),
    ("POST", f"{LABELS}/bob", {"data": b'{"x": {}}'}),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": 3}'}),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": {"x": NaN}}'}),
    ("POST", f"{LABELS}/bob", {"data": b""}),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": {"x": "' + b"y" * LIMIT + b'"}}'}),  # 413
    (
        "POST",  # a chunked body (no Content-Length) over the limit: 413 as well
        f"{LABELS}/bob",
        {
            "input_stream": io.BytesIO(b'{"metadata": {"x": "' + b"y" * LIMIT + b'"}}'),
            "environ_overrides": {"wsgi.input_terminated": True},
        },
    ),
    ("POST", f"{LABELS}/bob", {"data": b'{"metadata": {"x": "\\u0000"}}'}),  # refused by the db
    ("PATCH", f"{LABELS}/nobody", {"json": {"metadata": {}}}),  # 404
    ("DELETE", f"{LABELS}/nobody", {}),  # 204 all the same
    ("DELETE", f"{LABELS}/alice", {}),
    ("GET", f"{LABELS}/alice", {}),  # 410
    ("PATCH", f"{LABELS}/alice", {"json": {"metadata": {}}}),  # 410
    ("DELETE", f"{LABELS}/alice", {}),
    ("POST", f"{LABELS}/alice", {"json": {"metadata": {}}}),  # 409: deleted names stay taken
    ("DELETE", "/state-machines/nope/labels/alice", {}),
    # Flask's own, next to the direct routes:
    ("HEAD", f"{LABELS}/a%2Fb%20c", {}),
    ("OPTIONS", f"{LABELS}/a%2Fb%20c", {}),
    ("PUT", f"{LABELS}/a%2Fb%20c", {"json": {"metadata": {}}}),  # 405 with Allow
    ("POST", f"{LABELS}/", {"json": {"metadata": {}}}),
    ("GET", f"{LABELS}/a%2Fb%20c/", {}),
    ("GET", "/state-machines//user/labels/x", {}),
    ("GET", f"{LABELS}/a%2Fb%20c/history", {}),
    ("GET", LABELS, {}),
]


def _app(
    engine: sa.Engine, config: Config, *, direct: bool, metrics: Metrics | None = None
) -> RoutemasterFlask:
    app = App(
        config=config,
        db=engine,
        settings=Settings(max_request_body=LIMIT, token_use_interval=3600),
        clock=lambda: NOW,
        metrics=metrics,
    )
    flask_app = create_app(app)
    assert isinstance(flask_app, RoutemasterFlask)
    if not direct:
        flask_app.hot = None
    return flask_app


def _empty(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE labels, history, trigger_occurrences RESTART IDENTITY"))


def _answers(flask_app: flask.Flask, script: list[Request]) -> list[tuple[str, list[Any], bytes]]:
    client = flask_app.test_client()
    answers = []
    for method, path, kwargs in script:
        if "input_stream" in kwargs:
            kwargs["input_stream"].seek(0)
        response: TestResponse = client.open(path, method=method, **kwargs)
        answers.append((response.status, sorted(response.headers.items()), response.data))
    return answers


def _count_flask_dispatches(
    flask_app: flask.Flask, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], int]:
    counted: list[int] = []
    dispatch = flask_app.full_dispatch_request

    def counting() -> flask.Response:
        counted.append(1)
        return dispatch()

    monkeypatch.setattr(flask_app, "full_dispatch_request", counting)
    return lambda: len(counted)


def test_direct_dispatch_answers_exactly_as_flask(
    db_engine: sa.Engine, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    through_flask = _app(db_engine, config, direct=False)
    expected = _answers(through_flask, SCRIPT)
    _empty(db_engine)
    direct = _app(db_engine, config, direct=True)
    flask_dispatches = _count_flask_dispatches(direct, monkeypatch)
    answers = _answers(direct, SCRIPT)
    for request, got, want in zip(SCRIPT, answers, expected, strict=True):
        assert got == want, request[:2]
    # Flask dispatched only the last eight and the two names that do not decode
    # (other errors are answered by Flask's handlers in a request context).
    assert flask_dispatches() == 8 + 2
    assert [status[:3] for status, _, _ in answers[:33]] == [
        "201", "409", "200", "200", "200", "200", "200", "201", "200", "404", "400", "400",
        "400", "404", "404", "400", "400", "400", "400", "400", "400", "400", "413", "413",
        "400", "404", "204", "204", "410", "410", "204", "409", "404",
    ]  # fmt: skip


def test_direct_dispatch_answers_a_database_outage_exactly_as_flask(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = create_engine("postgresql://postgres@127.0.0.1:9/none", pool_size=1)
    script: list[Request] = [
        ("GET", f"{LABELS}/a", {}),
        ("POST", f"{LABELS}/a", {"json": {"metadata": {}}}),
        ("PATCH", f"{LABELS}/a", {"json": {"metadata": {}}}),
        ("DELETE", f"{LABELS}/a", {}),
    ]
    with caplog.at_level(logging.WARNING):
        expected = _answers(_app(unreachable, config, direct=False), script)
        flask_logs = [(r.name, r.levelname) for r in caplog.records]
        caplog.clear()
        answers = _answers(_app(unreachable, config, direct=True), script)
        direct_logs = [(r.name, r.levelname) for r in caplog.records]
    assert answers == expected
    assert {status for status, _, _ in answers} == {"503 SERVICE UNAVAILABLE"}
    assert direct_logs == flask_logs and flask_logs
    unreachable.dispose()


def test_a_hook_or_a_signal_receiver_sends_every_request_through_flask(
    db_engine: sa.Engine, config: Config
) -> None:
    flask_app = _app(db_engine, config, direct=True)

    @flask_app.after_request
    def stamp(response: flask.Response) -> flask.Response:
        response.headers["X-Seen"] = flask.request.method
        return response

    @labels_blueprint_hook(flask_app)
    def count(response: flask.Response) -> flask.Response:
        response.headers["X-Labels"] = "1"
        return response

    client = flask_app.test_client()
    created = client.post(f"{LABELS}/a", json={"metadata": {}})
    assert (created.headers["X-Seen"], created.headers["X-Labels"]) == ("POST", "1")
    assert client.get(f"{LABELS}/a").headers["X-Seen"] == "GET"
    assert client.patch(f"{LABELS}/a", json={"metadata": {}}).headers["X-Seen"] == "PATCH"
    flask_app.after_request_funcs.clear()
    assert "X-Seen" not in client.get(f"{LABELS}/a").headers

    started: list[str] = []

    def record(sender: flask.Flask, **extra: Any) -> None:
        started.append(flask.request.path)

    with flask.request_started.connected_to(record, flask_app):
        client.delete(f"{LABELS}/a")
    assert started == [f"{LABELS}/a"]


def labels_blueprint_hook(
    flask_app: flask.Flask,
) -> Callable[[Callable[[flask.Response], flask.Response]], Any]:
    """Register an after-request hook on the labels blueprint only."""

    def register(hook: Callable[[flask.Response], flask.Response]) -> Any:
        flask_app.after_request_funcs.setdefault("labels", []).append(hook)
        return hook

    return register


def test_an_unexpected_error_is_answered_and_logged_exactly_as_flask_does(
    db_engine: sa.Engine,
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(label_service, "get_label", broken)
    script: list[Request] = [("GET", f"{LABELS}/a", {})]
    with caplog.at_level(logging.ERROR):
        expected = _answers(_app(db_engine, config, direct=False), script)
        flask_logs = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        caplog.clear()
        answers = _answers(_app(db_engine, config, direct=True), script)
        direct_logs = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert answers == expected
    assert answers[0][0] == "500 INTERNAL SERVER ERROR"
    assert direct_logs == flask_logs and flask_logs


def _with_hooks(flask_app: flask.Flask, seen: list[tuple[str, str, int]]) -> None:
    """A before step that refuses requests without a key, an after step that records and stamps."""

    def key_required(request: flask.Request) -> flask.Response | None:
        if request.headers.get("X-Key") == "k":
            return None
        return json_response({"message": "no key"}, 401)

    def stamp(request: flask.Request, response: flask.Response) -> flask.Response:
        rule = request.url_rule.rule if request.url_rule is not None else "-"
        seen.append((request.method, rule, response.status_code))
        response.headers["X-Seen"] = f"{request.method} {response.status_code}"
        return response

    hot.before_request(flask_app, key_required)
    hot.after_request(flask_app, stamp)


def test_hooks_registered_for_both_dispatches_run_exactly_as_flask_runs_them(
    db_engine: sa.Engine, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed = [(m, p, {**kw, "headers": {"X-Key": "k"}}) for m, p, kw in SCRIPT]
    script = [*keyed, *SCRIPT[:3], *SCRIPT[9:12]]  # and a few without the key: 401
    seen_through_flask: list[tuple[str, str, int]] = []
    through_flask = _app(db_engine, config, direct=False)
    _with_hooks(through_flask, seen_through_flask)
    expected = _answers(through_flask, script)
    _empty(db_engine)
    seen_direct: list[tuple[str, str, int]] = []
    direct = _app(db_engine, config, direct=True)
    _with_hooks(direct, seen_direct)
    flask_dispatches = _count_flask_dispatches(direct, monkeypatch)
    answers = _answers(direct, script)
    for request, got, want in zip(script, answers, expected, strict=True):
        assert got == want, request[:2]
    assert seen_direct == seen_through_flask
    assert {status for status, _, _ in answers[len(keyed) :]} == {"401 UNAUTHORIZED"}
    # Flask dispatched its own routes and the names that do not decode (two with the key, one
    # without)
    assert flask_dispatches() == 8 + 2 + 1


def test_with_tokens_and_metrics_on_label_requests_stay_direct_and_answer_as_flask(
    db_engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = tmp_path / "tokens.yaml"
    layer.write_text("api:\n  authentication: tokens\n")
    secured = load_config([CONFIG_PATH, layer])
    apps = []
    for direct in (False, True):
        flask_app = _app(db_engine, secured, direct=direct, metrics=Metrics())
        cache = token_cache(flask_app)
        assert cache is not None and cache.wait_until_current(10)
        apps.append(flask_app)
    try:
        writer, _ = create_token(db_engine, "writer", {"read", "write"}, wait=10)
        reader, _ = create_token(db_engine, "reader", {"read"}, wait=10)
        headers = {
            "writer": {"Authorization": f"Bearer {writer.secret}"},
            "reader": {"Authorization": f"Bearer {reader.secret}"},
            "nobody": {"Authorization": "Bearer nope"},
        }
        script: list[Request] = [
            (method, path, {**kwargs, "headers": headers[who]})
            for who in ("writer", "reader", "nobody")
            for method, path, kwargs in SCRIPT[:12]
        ]
        expected = _answers(apps[0], script)
        _empty_labels(db_engine)
        flask_dispatches = _count_flask_dispatches(apps[1], monkeypatch)
        answers = _answers(apps[1], script)
        for request, got, want in zip(script, answers, expected, strict=True):
            assert got == want, request[:2]
        statuses = {status[:3] for status, _, _ in answers}
        assert {"200", "201", "401", "403"} <= statuses
        assert flask_dispatches() == 3  # the name that does not decode, once per token
        for flask_app in apps:  # each counted its own requests alike
            metrics = flask_app.test_client().get("/metrics").data
            assert b'endpoint="/state-machines/{sm}/labels/{label}"' in metrics
    finally:
        for flask_app in apps:
            cache = token_cache(flask_app)
            assert cache is not None
            cache.close()


def _empty_labels(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE labels, history RESTART IDENTITY"))
