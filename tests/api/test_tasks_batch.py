"""``POST /tasks/complete`` (SPEC E4): many completions, each fenced, then the next claim."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import flask
import pytest
import sqlalchemy as sa

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.web import create_app
from tests.api.helpers import body
from tests.api.openapi_check import CheckedClient
from tests.api.tasks_support import (
    CONFIG,
    START,
    Client,
    MakeClient,
    claim,
    create,
    label,
    tasks_client,
)
from tests.api.tokens import TOKENS, bearer, secured_api
from tests.metrics.test_metrics import metered_app, scrape, value
from tests.worker.conftest import FakeClock


@pytest.fixture
def client(tmp_path: Path, db_engine: sa.Engine) -> Client:
    make: MakeClient = tasks_client(tmp_path, db_engine)
    return make(FakeClock(START))[0]


def test_a_batch_answers_each_completion_in_order_as_the_single_endpoint_would(
    client: Client,
) -> None:
    for name in ("a", "b", "c"):
        create(client, "jobs", name)
    first, stale, last = claim(client, limit=3)
    assert client.post(f"/tasks/{stale['id']}/complete").status_code == 200  # now stale
    answer = client.post(
        "/tasks/complete",
        json={
            "tasks": [
                {"id": first["id"], "metadata": {"ok": True}},
                {"id": stale["id"], "metadata": {"ok": True}},
                {"id": "never-issued"},
                {"id": last["id"]},
                {"id": first["id"]},  # twice: the second is refused, as a second call is
            ]
        },
    )
    assert answer.status_code == 200
    completed = body(answer)["completed"]
    assert [(entry["id"], entry["status"]) for entry in completed] == [
        (first["id"], 200),
        (stale["id"], 409),
        ("never-issued", 404),
        (last["id"], 200),
        (first["id"], 409),
    ]
    assert completed[0]["label"]["state"] == "done"  # through `check`, which saw ok
    assert completed[0]["label"]["metadata"] == {"ok": True}
    assert completed[0]["label"] == label(client, "jobs", first["label"])
    assert completed[3]["label"]["state"] == "check"
    assert completed[1]["reason"] == "lease_lost" and "lease" in completed[1]["message"]
    assert "never-issued" in completed[2]["message"] and "reason" not in completed[2]
    assert body(answer)["tasks"] == []
    assert label(client, "jobs", stale["label"])["metadata"] == {}  # the stale id changed nothing


def test_a_batch_with_a_claim_completes_first_then_claims(client: Client) -> None:
    for name in ("a", "b", "c"):
        create(client, "jobs", name)
    [task] = claim(client)
    answer = client.post(
        "/tasks/complete",
        json={"tasks": [{"id": task["id"]}], "claim": {"worker": "w1", "limit": 5}},
    )
    assert [entry["status"] for entry in body(answer)["completed"]] == [200]
    assert sorted(t["label"] for t in body(answer)["tasks"]) == ["b", "c"]
    nothing_done = client.post("/tasks/complete", json={"tasks": [], "claim": {"worker": "w1"}})
    assert body(nothing_done) == {"completed": [], "tasks": []}


def test_a_claim_that_waits_answers_with_the_completions(client: Client) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    answer = client.post(
        "/tasks/complete",
        json={"tasks": [{"id": task["id"]}], "claim": {"worker": "w1", "wait": 0.3}},
    )
    assert answer.status_code == 200
    assert [entry["status"] for entry in body(answer)["completed"]] == [200]
    assert body(answer)["tasks"] == []


@pytest.mark.parametrize(
    ("request_body", "fragment"),
    [
        ({"tasks": []}, "give tasks to complete, or a"),
        ({}, '"tasks" is required'),
        ({"tasks": [{"id": f"t{i}"} for i in range(101)]}, "at most 100"),
        ({"tasks": [{"metadata": {}}]}, '"tasks[0].id" is required'),
        ({"tasks": [{"id": "x", "metadata": 3}]}, '"tasks[0].metadata" must be a JSON object'),
        ({"tasks": [{"id": "x", "extra": 1}]}, "Unknown field 'extra'"),
        ({"tasks": [], "claim": {"limit": 2}}, '"claim.worker" is required'),
        ({"tasks": [], "claim": "w1"}, '"claim" must be a JSON object'),
    ],
)
def test_a_malformed_batch_is_refused_and_completes_nothing(
    client: Client, request_body: dict[str, object], fragment: str
) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    answer = client.post("/tasks/complete", json=request_body)
    assert answer.status_code == 400
    assert fragment in body(answer)["message"]
    if "claim" in request_body:  # a bad claim also completes nothing
        bad = {**request_body, "tasks": [{"id": task["id"]}]}
        assert client.post("/tasks/complete", json=bad).status_code == 400
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 200


@pytest.fixture
def measured(db_engine: sa.Engine, tmp_path: Path) -> Client:
    path = tmp_path / "tasks.yaml"
    path.write_text(CONFIG)
    flask_app = create_app(metered_app(load_config([path]), db_engine))
    flask_app.test_client_class = CheckedClient
    return flask_app.test_client()


def test_batches_and_their_completions_are_counted_in_metrics(measured: Client) -> None:
    client = measured
    create(client, "jobs", "a")
    create(client, "jobs", "b")
    tasks = claim(client, limit=2)
    client.post("/tasks/complete", json={"tasks": [{"id": t["id"]} for t in tasks]})
    samples = scrape(client)
    requests = "routemaster_http_requests_total"
    assert value(samples, requests, method="POST", endpoint="/tasks/complete", status="200") == 1
    events = {"state_machine": "jobs", "state": "process", "event": "completed"}
    assert value(samples, "routemaster_tasks_total", **events) == 2


@pytest.fixture
def secured(db_engine: sa.Engine, tmp_path: Path) -> Iterator[flask.Flask]:
    path = tmp_path / "tasks.yaml"
    path.write_text(CONFIG + TOKENS)
    app = App(config=load_config([path]), db=db_engine, settings=Settings(token_use_interval=3600))
    with secured_api(app) as flask_app:
        yield flask_app


def test_completing_needs_no_token_and_claiming_in_the_batch_needs_work(
    secured: flask.Flask, db_engine: sa.Engine
) -> None:
    client = secured.test_client()
    writer, worker = bearer(db_engine, "write"), bearer(db_engine, "work")
    for name in ("a", "b"):
        client.post(f"/state-machines/jobs/labels/{name}", json={"metadata": {}}, headers=writer)
    [task] = body(client.post("/tasks/claim", json={"worker": "w"}, headers=worker))["tasks"]
    with_claim = {"tasks": [{"id": task["id"]}], "claim": {"worker": "w"}}
    assert client.post("/tasks/complete", json=with_claim).status_code == 401
    refused = client.post("/tasks/complete", json=with_claim, headers=writer)
    assert refused.status_code == 403 and "work" in body(refused)["message"]
    alone = client.post("/tasks/complete", json={"tasks": [{"id": task["id"]}]})
    assert [entry["status"] for entry in body(alone)["completed"]] == [200]
    claimed = client.post(
        "/tasks/complete", json={"tasks": [], "claim": {"worker": "w"}}, headers=worker
    )
    assert [t["label"] for t in body(claimed)["tasks"]] == ["b"]
    reader = bearer(db_engine, "read")
    document = body(client.get("/openapi.json", headers=reader))
    operation = document["paths"]["/tasks/complete"]["post"]
    assert operation["security"] == [{}, {"bearerToken": ["work"]}]
    assert {"401", "403"} <= set(operation["responses"])


TIMED = """
state_machines:
  mail:
    states:
      - action: send
        worker: {lease: 1m}
        next: wait
      - gate: wait
        triggers: [{event: timer}]
        exit_condition: metadata.reply is defined or 2h has passed since history.entered_state
        next: done
      - gate: done
        exit_condition: false
  once:
    states:
      - action: only
        worker: {lease: 1m}
"""


def test_a_batch_schedules_labels_moved_into_timed_gates_and_settles_those_that_rest(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    """Issue 28's rows stay exact: a next check where a timer waits, none owed elsewhere."""
    client, _ = tasks_client(tmp_path, db_engine)(FakeClock(START), config=TIMED)
    create(client, "mail", "a")
    create(client, "once", "b")
    tasks = {task["label"]: task["id"] for task in claim(client, limit=2)}
    answer = client.post(
        "/tasks/complete", json={"tasks": [{"id": tasks["a"]}, {"id": tasks["b"]}]}
    )
    moved, rested = (entry["label"] for entry in body(answer)["completed"])
    assert moved["state"] == "wait" and rested["state"] == "only"
    assert rested == label(client, "once", "b")
    explained = body(client.get("/state-machines/mail/labels/a/explain"))
    assert explained["next_check_at"] == "2026-11-24T14:00:00+00:00"
    assert "2h has passed since history.entered_state" in explained["next_check_reason"]
    with db_engine.connect() as conn:
        unscheduled = conn.execute(
            sa.text("SELECT count(*) FROM labels WHERE scheduled_at IS DISTINCT FROM updated_at")
        ).scalar_one()
    assert unscheduled == 0  # nothing left for the workers to compute
