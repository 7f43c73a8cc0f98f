"""A feed answering unusable JSON fails the evaluation, not the request: retried later."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.app import App
from routemaster.config import load_config
from routemaster.web import create_app
from tests.api.helpers import body
from tests.stub_server import Reply, StubServer, running_stub

CONFIG = """
state_machines:
  user:
    feeds:
      - name: checks
        url: {url}
    states:
      - gate: start
        triggers:
          - event: entry
        exit_condition: feeds.checks.ok = true
        next: done
      - gate: done
        exit_condition: false
"""


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from running_stub()


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (Reply(200, b'{"ok": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "nested deeper"),
        (Reply(200, b"<html>"), "not valid JSON"),
        (Reply(200, b'{"ok": true, "pad": "' + b"x" * 2_000_000 + b'"}'), "more than"),
    ],
)
def test_create_answers_201_and_the_label_waits_for_a_retry(
    tmp_path: Path, db_engine: sa.Engine, stub: StubServer, reply: Reply, problem: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(url=stub.url("/checks/<label>")))
    stub.script("/checks/ann", reply)
    client = create_app(App(config=load_config([path]), db=db_engine)).test_client()
    response = client.post("/state-machines/user/labels/ann", json={"metadata": {}})
    assert response.status_code == 201
    assert body(response)["state"] == "start"
    explained = body(client.get("/state-machines/user/labels/ann/explain"))
    assert problem in explained["last_error"]
    assert explained["due_at"] is not None  # the worker evaluates it again later
