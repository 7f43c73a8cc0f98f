"""The API calls the 1.x plugin hooks: init_flask, around each request, on unexpected errors."""

from __future__ import annotations

from typing import Any

import flask
import pytest
import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import Config
from routemaster.web import create_app
from tests.plugin_recorder import Broken, Recorder


@pytest.fixture
def recorder(config: Config) -> Recorder:
    return Recorder(config)


@pytest.fixture
def plugged(db_engine: sa.Engine, config: Config, recorder: Recorder) -> flask.Flask:
    return create_app(App(config=config, db=db_engine, loggers=(recorder,)))


def test_init_flask_gets_the_app_and_every_request_is_wrapped(
    plugged: flask.Flask, recorder: Recorder
) -> None:
    assert recorder.events == [("init_flask", "routemaster.api")]
    client = plugged.test_client()
    # buffered: the client reads the body and closes it, as a WSGI server does
    created = client.post("/state-machines/user/labels/ann", json={"metadata": {}}, buffered=True)
    assert created.status_code == 201
    assert client.get("/state-machines/nope/labels", buffered=True).status_code == 404
    assert recorder.events[1:] == [
        ("request_started", "POST", "/state-machines/user/labels/ann"),
        ("request_finished", "/state-machines/user/labels/ann", "201", None),
        ("request_started", "GET", "/state-machines/nope/labels"),
        ("request_finished", "/state-machines/nope/labels", "404", None),
    ]


def test_check_loggers_fails_on_purpose_and_every_plugin_hears_of_it(
    plugged: flask.Flask, recorder: Recorder
) -> None:
    signalled: list[BaseException] = []

    def on_exception(sender: flask.Flask, exception: BaseException, **extra: Any) -> None:
        signalled.append(exception)

    flask.got_request_exception.connect(on_exception, plugged)
    try:
        response = plugged.test_client().get("/check-loggers")
    finally:
        flask.got_request_exception.disconnect(on_exception, plugged)
    assert response.status_code == 500
    assert response.json == {"message": "Internal server error."}
    assert [type(error).__name__ for error in signalled] == ["LoggerCheckError"]
    assert recorder.named("exception") == [
        ("exception", "Unhandled error in GET /check-loggers", "LoggerCheckError")
    ]
    assert recorder.named("request_finished") == [
        ("request_finished", "/check-loggers", "500", None)
    ]


def test_client_errors_are_not_reported_as_exceptions(
    plugged: flask.Flask, recorder: Recorder
) -> None:
    client = plugged.test_client()
    assert client.post("/state-machines/user/labels/x", data="not json").status_code == 400
    assert client.get("/nowhere").status_code == 404
    assert recorder.named("exception") == []


def test_a_plugin_that_fails_never_breaks_a_request(
    db_engine: sa.Engine, config: Config, recorder: Recorder
) -> None:
    flask_app = create_app(App(config=config, db=db_engine, loggers=(Broken(), recorder)))
    response = flask_app.test_client().get("/")
    assert response.status_code == 200
    assert response.json is not None and response.json["status"] == "ok"
    response.close()
    assert recorder.named("request_finished") == [("request_finished", "/", "200", None)]
