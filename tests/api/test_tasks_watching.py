"""Tasks where people look: metrics per machine, state and event; the console."""

from __future__ import annotations

from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.config import load_config
from routemaster.web import create_app
from tests.api.openapi_check import CheckedClient
from tests.api.tasks_support import CONFIG, START, claim, create
from tests.metrics.test_metrics import metered_app, scrape, value
from tests.worker.conftest import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def client(db_engine: sa.Engine, tmp_path: Path, clock: FakeClock) -> FlaskClient:
    path = tmp_path / "tasks.yaml"
    path.write_text(CONFIG)
    flask_app: flask.Flask = create_app(metered_app(load_config([path]), db_engine, clock))
    flask_app.test_client_class = CheckedClient
    return flask_app.test_client()


def test_task_events_are_counted_per_machine_state_and_event(
    client: FlaskClient, clock: FakeClock
) -> None:
    for name in ("a", "b", "c", "d"):
        create(client, "jobs", name)
    tasks = claim(client, limit=4)
    client.post(f"/tasks/{tasks[0]['id']}/complete")
    client.post(f"/tasks/{tasks[1]['id']}/fail", json={"error": "x"})
    client.post(f"/tasks/{tasks[2]['id']}/release")
    clock.advance(seconds=31)  # the fourth lease runs out, and the next claim says so
    claim(client)
    samples = scrape(client)
    for event, count in (
        ("claimed", 5),
        ("completed", 1),
        ("failed", 1),
        ("released", 1),
        ("expired", 1),
    ):
        labels = {"state_machine": "jobs", "state": "process", "event": event}
        assert value(samples, "routemaster_tasks_total", **labels) == count, event


def test_the_console_shows_tasks_in_flight_and_who_holds_a_label(client: FlaskClient) -> None:
    create(client, "jobs", "a")
    create(client, "jobs", "b")
    claim(client, worker="builder-7")
    page = client.get("/console/machines/jobs").get_data(as_text=True)
    assert "Tasks in flight" in page
    assert 'data-state="process">1</td>' in page
    assert "pull workers, lease 30s" in page
    label_page = client.get("/console/machines/jobs/labels/a").get_data(as_text=True)
    assert "Held by worker <strong>builder-7</strong> (attempt 1)" in label_page
    assert '<span class="lease">30 s (fixed)</span>' in label_page
    waiting = client.get("/console/machines/jobs/labels/b").get_data(as_text=True)
    assert "it waits for a claim" in waiting


def test_a_machine_description_names_its_pull_actions(client: FlaskClient) -> None:
    response = client.get("/state-machines/jobs")
    states = {state["name"]: state for state in response.get_json()["states"]}
    assert states["process"]["worker"] == {"lease": 30, "at_most_once": False}
    assert states["process"]["webhook"] is None
    assert states["check"]["worker"] is None


def test_a_labels_tasks_show_each_attempt_and_how_it_ended(client: FlaskClient) -> None:
    create(client, "jobs", "a")
    [first] = claim(client, worker="w1")
    client.post(f"/tasks/{first['id']}/fail", json={"error": "x", "retry_after": 0})
    [second] = claim(client, worker="w2")
    client.post(f"/tasks/{second['id']}/complete")
    response = client.get("/state-machines/jobs/labels/a/tasks")
    assert response.status_code == 200
    tasks = response.get_json()["tasks"]
    assert [(t["attempt"], t["worker"], t["outcome"]) for t in tasks] == [
        (1, "w1", "failed"),
        (2, "w2", "completed"),
    ]
    assert all("id" not in task for task in tasks)
    page = client.get("/console/machines/jobs/labels/a").get_data(as_text=True)
    assert "<h2>Tasks</h2>" in page
