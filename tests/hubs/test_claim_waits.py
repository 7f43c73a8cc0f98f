"""Claims that wait (``"wait": N``): woken by new work, or answered empty at their deadline."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.api.tasks import WAITER_KEY, claim_waiter
from routemaster.hubs import claim_waits
from tests.api.helpers import body
from tests.api.tasks_support import MakeClient, create, tasks_client
from tests.waiting import wait_until


@pytest.fixture
def make_client(tmp_path: Path, db_engine: sa.Engine) -> MakeClient:
    return tasks_client(tmp_path, db_engine)


def claim_in_thread(client: FlaskClient, **fields: Any) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}

    def run() -> None:
        response = client.post("/tasks/claim", json={"worker": "w", **fields})
        answer["status"] = response.status_code
        answer["tasks"] = body(response)["tasks"]
        answer["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answer


def waiting(client: FlaskClient) -> int:
    application = client.application
    assert isinstance(application, flask.Flask)
    return claim_waiter(application).waiting


def test_a_waiting_claim_is_woken_by_a_label_entering_the_action(
    make_client: MakeClient,
) -> None:
    client, _ = make_client(poll_interval=20)  # only a NOTIFY can wake it in time
    thread, answer = claim_in_thread(client, wait=30)
    wait_until(lambda: waiting(client) == 1, "the claim waiting", timeout=5)
    entered = time.monotonic()
    create(client, "jobs", "new")
    thread.join(timeout=10)
    assert answer["status"] == 200
    assert [task["label"] for task in answer["tasks"]] == ["new"]
    assert answer["at"] - entered < 5, "woken by NOTIFY, not by a poll or the deadline"
    assert waiting(client) == 0


def test_a_waiting_claim_with_nothing_to_do_answers_empty_at_its_deadline(
    make_client: MakeClient,
) -> None:
    client, _ = make_client()
    started = time.monotonic()
    thread, answer = claim_in_thread(client, wait=0.5)
    thread.join(timeout=10)
    assert answer["tasks"] == []
    assert 0.5 <= answer["at"] - started < 5


def test_waiting_claims_only_take_their_own_states(make_client: MakeClient) -> None:
    client, _ = make_client()
    shop, shop_answer = claim_in_thread(client, state_machine="shop", wait=30)
    jobs, jobs_answer = claim_in_thread(client, state="process", wait=30)
    wait_until(lambda: waiting(client) == 2, "both claims waiting", timeout=5)
    create(client, "jobs", "j")
    jobs.join(timeout=10)
    assert [task["label"] for task in jobs_answer["tasks"]] == ["j"]
    assert shop.is_alive()
    create(client, "shop", "s", {"go": True})
    shop.join(timeout=10)
    assert [task["label"] for task in shop_answer["tasks"]] == ["s"]


def test_a_released_task_goes_to_a_waiting_claim(make_client: MakeClient) -> None:
    client, _ = make_client()
    create(client, "jobs", "a")
    [task] = body(client.post("/tasks/claim", json={"worker": "w1"}))["tasks"]
    thread, answer = claim_in_thread(client, wait=30)
    wait_until(lambda: waiting(client) == 1, "the claim waiting", timeout=5)
    client.post(f"/tasks/{task['id']}/release")
    thread.join(timeout=10)
    assert [(t["label"], t["attempt"]) for t in answer["tasks"]] == [("a", 1)]


def test_the_claim_thread_stops_when_idle_and_starts_again_when_needed(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claim_waits, "IDLE_EXIT", 0.1)
    client, _ = make_client()
    application = client.application
    assert isinstance(application, flask.Flask)
    waiter = claim_waiter(application)
    thread, answer = claim_in_thread(client, wait=0.2)
    thread.join(timeout=10)
    assert answer["tasks"] == []
    wait_until(lambda: not waiter.running, "the idle claim thread stopped", timeout=5)
    thread, answer = claim_in_thread(client, wait=30)
    wait_until(lambda: waiting(client) == 1, "the claim waiting", timeout=5)
    assert waiter.running
    create(client, "jobs", "later")
    thread.join(timeout=10)
    assert [task["label"] for task in answer["tasks"]] == ["later"]


def test_waiting_claims_beyond_the_limit_are_refused(make_client: MakeClient) -> None:
    client, _ = make_client(max_waiting_claims=1)
    thread, answer = claim_in_thread(client, wait=30)
    wait_until(lambda: waiting(client) == 1, "the claim waiting", timeout=5)
    refused = client.post("/tasks/claim", json={"worker": "w2", "wait": 30})
    assert refused.status_code == 503
    assert "waiting claims" in body(refused)["message"]
    assert body(client.post("/tasks/claim", json={"worker": "w3"}))["tasks"] == []  # no wait
    create(client, "jobs", "x")
    thread.join(timeout=10)
    assert [task["label"] for task in answer["tasks"]] == ["x"]


def test_a_claim_that_does_not_wait_never_reaches_the_claim_waiter(
    make_client: MakeClient,
) -> None:
    """A claim without ``wait`` (or with 0) is made and answered by the request itself: with
    no waiter in the process at all, claims and a batch completion's claim still answer."""
    client, _ = make_client()
    application = client.application
    assert isinstance(application, flask.Flask)
    del application.extensions[WAITER_KEY]
    assert body(client.post("/tasks/claim", json={"worker": "w"}))["tasks"] == []
    assert body(client.post("/tasks/claim", json={"worker": "w", "wait": 0}))["tasks"] == []
    create(client, "jobs", "now")
    [task] = body(client.post("/tasks/claim", json={"worker": "w", "wait": 5}))["tasks"]
    completed = client.post(
        "/tasks/complete", json={"tasks": [{"id": task["id"]}], "claim": {"worker": "w"}}
    )
    assert completed.status_code == 200, body(completed)
    assert body(completed)["tasks"] == [] and body(completed)["completed"][0]["status"] == 200
