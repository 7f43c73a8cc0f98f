"""Tokens and pull workers: claiming needs ``work``; the task id is the permission for the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from flask.testing import FlaskClient

from routemaster.app import App, Settings
from routemaster.cli import cli
from routemaster.config import load_config
from tests.api.helpers import body
from tests.api.tasks_support import CONFIG
from tests.api.tokens import TOKENS, bearer, secured_api


@pytest.fixture
def secured(db_engine: sa.Engine, tmp_path: Path) -> Iterator[flask.Flask]:
    path = tmp_path / "tasks.yaml"
    path.write_text(CONFIG + TOKENS)
    app = App(config=load_config([path]), db=db_engine, settings=Settings(token_use_interval=3600))
    with secured_api(app) as flask_app:
        yield flask_app


def test_claiming_needs_the_work_scope_and_the_task_id_needs_no_token(
    secured: flask.Flask, db_engine: sa.Engine
) -> None:
    client: FlaskClient = secured.test_client()
    writer, worker = bearer(db_engine, "write"), bearer(db_engine, "work")
    created = client.post("/state-machines/jobs/labels/a", json={"metadata": {}}, headers=writer)
    assert created.status_code == 201
    assert client.post("/tasks/claim", json={"worker": "w"}).status_code == 401
    refused = client.post("/tasks/claim", json={"worker": "w"}, headers=writer)
    assert refused.status_code == 403
    assert "work" in body(refused)["message"]
    [task] = body(client.post("/tasks/claim", json={"worker": "w"}, headers=worker))["tasks"]
    assert client.post(f"/tasks/{task['id']}/heartbeat").status_code == 200  # no token
    assert client.post(f"/tasks/{task['id']}/heartbeat", headers=writer).status_code == 200
    bad = {"Authorization": "Bearer rm_0000000000000000_" + "x" * 43}
    assert client.post(f"/tasks/{task['id']}/heartbeat", headers=bad).status_code == 401
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 200


def test_the_openapi_document_says_which_calls_need_no_token(
    secured: flask.Flask, db_engine: sa.Engine
) -> None:
    reader = bearer(db_engine, "read")
    document = body(secured.test_client().get("/openapi.json", headers=reader))
    claim = document["paths"]["/tasks/claim"]["post"]
    assert claim["security"] == [{"bearerToken": ["work"]}]
    complete = document["paths"]["/tasks/{task_id}/complete"]["post"]
    assert {} in complete["security"]
    assert "403" not in complete["responses"]


def test_token_create_accepts_the_work_scope(database_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(CONFIG)
    result = CliRunner().invoke(
        cli,
        ["-c", str(path), "token", "create", "transcoder", "--scope", "work"],
        env={"DATABASE_URL": database_url, "DB_HOST": None},
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith("rm_")
    assert "with scopes work" in result.stderr
