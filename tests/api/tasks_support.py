"""What the pull-worker tests share: a configuration with pull actions, a client, small calls."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flask
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.web import create_app
from tests.api.helpers import body
from tests.api.openapi_check import CheckedClient
from tests.pooler import pooled_run

CONFIG = """
state_machines:
  jobs:
    states:
      - action: process
        worker: {lease: 30s}
        retry: {max_attempts: 3, initial_delay: 10s, max_delay: 1m}
        next: check
      - gate: check
        triggers: [{event: entry}]
        exit_condition: metadata.ok = true
        next: done
      - gate: done
        exit_condition: false
  shop:
    states:
      - gate: start
        triggers: [{event: entry}, {metadata: go}]
        exit_condition: metadata.go = true
        next: pack
      - action: pack
        worker: {lease: 1m}
        next: ship
      - action: ship
        worker: {lease: 2m}
        next: end
      - gate: end
        exit_condition: false
"""

START = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)

Client = FlaskClient
MakeClient = Callable[..., tuple[Client, App]]


def tasks_client(tmp_path: Path, db_engine: sa.Engine) -> MakeClient:
    """``make(clock=None, config=CONFIG)``: a checked test client and its App."""

    def make(clock: Any = None, config: str = CONFIG, **settings: Any) -> tuple[Client, App]:
        path = tmp_path / "tasks.yaml"
        path.write_text(config)
        settings.setdefault("poll_interval", 0.2)
        app = App(
            config=load_config([path]),
            db=db_engine,
            settings=Settings(**settings),
            direct=None if pooled_run() else db_engine,
        )
        if clock is not None:
            app.clock = clock
        flask_app: flask.Flask = create_app(app)
        flask_app.test_client_class = CheckedClient
        return flask_app.test_client(), app

    return make


def create(
    client: Client, machine: str, label: str, metadata: dict[str, Any] | None = None
) -> None:
    response = client.post(
        f"/state-machines/{machine}/labels/{label}", json={"metadata": metadata or {}}
    )
    assert response.status_code == 201, body(response)


def claim(client: Client, **fields: Any) -> list[dict[str, Any]]:
    response = client.post("/tasks/claim", json={"worker": "w1", **fields})
    assert response.status_code == 200, body(response)
    tasks: list[dict[str, Any]] = body(response)["tasks"]
    return tasks


def label(client: Client, machine: str, name: str) -> dict[str, Any]:
    response = client.get(f"/state-machines/{machine}/labels/{name}")
    assert response.status_code == 200
    found: dict[str, Any] = body(response)
    return found
