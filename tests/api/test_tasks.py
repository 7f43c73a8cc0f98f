"""Pull workers (SPEC D1): claim, heartbeat, complete, fail, release, and fencing stale ids."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.db.keys import shard_key
from routemaster.service.tasks import forget_old_tasks
from tests.api.helpers import body
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
from tests.worker.conftest import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def make_client(tmp_path: Path, db_engine: sa.Engine) -> MakeClient:
    return tasks_client(tmp_path, db_engine)


@pytest.fixture
def client(make_client: MakeClient, clock: FakeClock) -> Client:
    return make_client(clock)[0]


def test_a_claimed_task_carries_the_label_and_completing_it_moves_the_label_on(
    client: Client,
) -> None:
    create(client, "jobs", "a", {"size": 3})
    [task] = claim(client)
    assert task["state_machine"] == "jobs"
    assert task["label"] == "a"
    assert task["state"] == "process"
    assert task["metadata"] == {"size": 3}
    assert task["attempt"] == 1
    assert task["idempotency_token"].isdigit()
    assert datetime.datetime.fromisoformat(task["lease_expires_at"]) == START + datetime.timedelta(
        seconds=30
    )
    assert len(task["id"]) >= 32
    assert claim(client) == []  # leased: nobody else gets it

    done = client.post(f"/tasks/{task['id']}/complete", json={"metadata": {"ok": True}})
    assert done.status_code == 200
    assert body(done)["state"] == "done"  # through `check`, whose entry trigger saw ok
    assert body(done)["metadata"] == {"size": 3, "ok": True}
    assert label(client, "jobs", "a")["state"] == "done"


def test_a_second_completion_is_refused_and_changes_nothing(client: Client) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    assert body(client.post(f"/tasks/{task['id']}/complete"))["state"] == "check"
    again = client.post(f"/tasks/{task['id']}/complete", json={"metadata": {"ok": True}})
    assert again.status_code == 409
    assert body(again)["reason"] == "lease_lost"
    after_first = label(client, "jobs", "a")
    assert (after_first["state"], after_first["metadata"]) == ("check", {})
    for call in ("heartbeat", "fail", "release"):
        response = client.post(f"/tasks/{task['id']}/{call}", json={"error": "late"})
        assert (response.status_code, body(response)["reason"]) == (409, "lease_lost")
    assert label(client, "jobs", "a") == after_first


def test_an_id_never_issued_is_not_found(client: Client) -> None:
    for call in ("heartbeat", "complete", "release"):
        assert client.post(f"/tasks/not-a-task/{call}").status_code == 404
    assert client.post("/tasks/not-a-task/fail", json={"error": "x"}).status_code == 404


def test_two_workers_racing_for_one_label_never_both_get_it(client: Client) -> None:
    create(client, "jobs", "only")
    results: list[list[dict[str, Any]]] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        results.append(claim(client, limit=5))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = [task for tasks in results for task in tasks]
    assert [task["label"] for task in claimed] == ["only"]


def test_many_workers_share_many_labels_without_duplicates(client: Client) -> None:
    for index in range(60):
        create(client, "jobs", f"l{index}")
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def work() -> None:
        while tasks := claim(client, limit=3):
            with lock:
                results.extend(tasks)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(task["label"] for task in results) == sorted(f"l{i}" for i in range(60))


def test_claims_take_the_oldest_due_first(client: Client, clock: FakeClock) -> None:
    for name in ("first", "second", "third"):
        create(client, "jobs", name)
        clock.advance(seconds=1)
    assert [task["label"] for task in claim(client, limit=2)] == ["first", "second"]
    assert [task["label"] for task in claim(client, limit=2)] == ["third"]


def test_a_dead_workers_lease_runs_out_and_its_late_completion_is_refused(
    client: Client, clock: FakeClock
) -> None:
    create(client, "jobs", "a")
    [first] = claim(client)  # ... and the worker dies
    clock.advance(seconds=31)
    assert claim(client, worker="w2") == []  # the run-out lease is a failed attempt: backoff
    explained = body(client.get("/state-machines/jobs/labels/a/explain"))
    assert "lease ran out" in explained["last_error"]
    clock.advance(seconds=11)  # past the backoff (10 s at most, with jitter)
    [second] = claim(client, worker="w2")
    assert second["attempt"] == 2
    assert second["id"] != first["id"]
    assert second["idempotency_token"] == first["idempotency_token"]  # the same entry
    late = client.post(f"/tasks/{first['id']}/complete", json={"metadata": {"ok": True}})
    assert (late.status_code, body(late)["reason"]) == (409, "lease_lost")
    assert client.post(f"/tasks/{first['id']}/heartbeat").status_code == 409
    assert label(client, "jobs", "a")["metadata"] == {}
    assert body(client.post(f"/tasks/{second['id']}/complete"))["state"] == "check"


def test_a_stale_id_is_refused_even_before_anyone_reclaims(
    client: Client, clock: FakeClock
) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    clock.advance(seconds=30)
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 409
    assert client.post(f"/tasks/{task['id']}/heartbeat").status_code == 409


def test_heartbeats_keep_a_long_task(client: Client, clock: FakeClock) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    for _ in range(5):  # 100 s of work on a 30 s lease
        clock.advance(seconds=20)
        beat = client.post(f"/tasks/{task['id']}/heartbeat", json={})
        assert beat.status_code == 200
        expires = datetime.datetime.fromisoformat(body(beat)["lease_expires_at"])
        assert expires == clock() + datetime.timedelta(seconds=30)
        assert claim(client, worker="w2") == []
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 200


def test_a_failure_is_retried_after_the_backoff_then_errored_after_max_attempts(
    client: Client, clock: FakeClock
) -> None:
    create(client, "jobs", "a")
    for attempt in (1, 2):
        [task] = claim(client)
        assert task["attempt"] == attempt
        failed = client.post(f"/tasks/{task['id']}/fail", json={"error": "disk full"})
        assert failed.status_code == 200
        assert body(failed)["last_error"] == "disk full"
        assert not body(failed)["errored"]
        assert claim(client) == []  # backing off
        clock.advance(minutes=1)
    [task] = claim(client)
    assert task["attempt"] == 3
    failed = client.post(f"/tasks/{task['id']}/fail", json={"error": "disk full"})
    assert body(failed)["errored"]
    assert "attempt 3 of 3" in body(failed)["last_error"]
    clock.advance(hours=1)
    assert claim(client) == []


def test_retry_after_sets_when_the_label_is_due_again(client: Client, clock: FakeClock) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    client.post(f"/tasks/{task['id']}/fail", json={"error": "busy", "retry_after": 0})
    [again] = claim(client)
    assert again["attempt"] == 2


def test_a_failure_without_retry_errors_the_label_and_the_operator_retries_it(
    client: Client,
) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    failed = client.post(f"/tasks/{task['id']}/fail", json={"error": "bad input", "retry": False})
    assert body(failed)["errored"]
    assert claim(client) == []
    errored = body(client.get("/state-machines/jobs/labels?errored=true"))["labels"]
    assert [entry["name"] for entry in errored] == ["a"]
    history = body(client.get("/state-machines/jobs/labels/a/history"))["history"]
    assert history[-1]["kind"] == "errored"  # on the changes streams too, as a webhook's
    assert "bad input" in history[-1]["reason"]
    assert client.post("/state-machines/jobs/labels/a/retry").status_code == 200
    [again] = claim(client)
    assert again["attempt"] == 1


def test_release_makes_the_label_due_at_once_without_counting_an_attempt(
    client: Client,
) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    released = client.post(f"/tasks/{task['id']}/release")
    assert released.status_code == 200
    assert body(released)["state"] == "process"
    [again] = claim(client, worker="w2")
    assert again["attempt"] == 1
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 409


def test_an_operator_move_ends_the_lease(client: Client) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    moved = client.post("/state-machines/jobs/labels/a/move", json={"state": "done"})
    assert moved.status_code == 200
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 409
    assert label(client, "jobs", "a")["state"] == "done"


def test_claims_across_machines_and_states(client: Client) -> None:
    create(client, "jobs", "j1")
    create(client, "shop", "s1", {"go": True})  # straight through `start` into `pack`
    assert label(client, "shop", "s1")["state"] == "pack"
    create(client, "shop", "s2", {"go": True})
    assert [t["label"] for t in claim(client, state_machine="shop")] == ["s1"]
    tasks = claim(client, limit=10)
    assert sorted((t["state_machine"], t["label"]) for t in tasks) == [
        ("jobs", "j1"),
        ("shop", "s2"),
    ]


def test_a_claim_can_name_one_state(client: Client) -> None:
    create(client, "shop", "s1", {"go": True})
    assert claim(client, state="ship") == []
    [task] = claim(client, state_machine="shop", state="pack")
    moved = client.post(f"/tasks/{task['id']}/complete")
    assert body(moved)["state"] == "ship"
    [shipped] = claim(client, state="ship")
    assert shipped["state"] == "ship"
    assert datetime.datetime.fromisoformat(shipped["lease_expires_at"]) == START + (
        datetime.timedelta(minutes=2)
    )


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({}, 400),
        ({"worker": ""}, 400),
        ({"worker": 5}, 400),
        ({"worker": "w", "limit": 0}, 400),
        ({"worker": "w", "limit": 101}, 400),
        ({"worker": "w", "limit": True}, 400),
        ({"worker": "w", "limit": 1.5}, 400),
        ({"worker": "w", "wait": 61}, 400),
        ({"worker": "w", "wait": -1}, 400),
        ({"worker": "w", "state_machine": "nope"}, 404),
        ({"worker": "w", "state": "check"}, 400),
        ({"worker": "w", "state_machine": "shop", "state": "process"}, 400),
    ],
)
def test_claims_with_bad_bodies_are_refused(
    client: Client, payload: dict[str, Any], status: int
) -> None:
    response = client.post("/tasks/claim", json=payload)
    assert response.status_code == status
    assert body(response)["message"]


def test_fail_needs_an_error(client: Client) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    assert client.post(f"/tasks/{task['id']}/fail", json={}).status_code == 400
    assert (
        client.post(f"/tasks/{task['id']}/fail", json={"error": "x", "retry": "no"}).status_code
        == 400
    )
    assert client.post(f"/tasks/{task['id']}/complete", json={"metadata": [1]}).status_code == 400
    assert client.post(f"/tasks/{task['id']}/heartbeat").status_code == 200


def test_explain_shows_who_holds_the_label_until_when(client: Client) -> None:
    create(client, "jobs", "a")
    [task] = claim(client, worker="builder-7")
    explained = body(client.get("/state-machines/jobs/labels/a/explain"))
    assert explained["kind"] == "action"
    assert explained["worker"] == {"lease": 30, "at_most_once": False}
    assert explained["task"]["lease"] == {"seconds": 30, "source": "fixed", "samples": 0}
    assert explained["task"]["worker"] == "builder-7"
    assert explained["task"]["attempt"] == 1
    assert explained["task"]["lease_expires_at"] == task["lease_expires_at"]
    assert "id" not in explained["task"]  # the id is the capability: never shown to readers


@pytest.mark.parametrize(
    ("method", "suffix"), [("delete", ""), ("post", "/pause")], ids=["deleted", "paused"]
)
def test_deleting_or_pausing_the_label_ends_the_lease(
    client: Client, method: str, suffix: str
) -> None:
    create(client, "jobs", "a")
    [task] = claim(client)
    assert getattr(client, method)(f"/state-machines/jobs/labels/a{suffix}").status_code < 300
    refused = client.post(f"/tasks/{task['id']}/complete", json={"metadata": {"ok": True}})
    assert (refused.status_code, body(refused)["reason"]) == (409, "lease_lost")
    assert client.post(f"/tasks/{task['id']}/heartbeat").status_code == 409


def test_old_tasks_are_forgotten_but_never_a_labels_current_one(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, app = make_client(clock, config=CONFIG.replace("lease: 30s", "lease: 24h"))
    create(client, "jobs", "done-long-ago")
    create(client, "jobs", "held")
    [old] = claim(client, state_machine="jobs")
    client.post(f"/tasks/{old['id']}/complete")
    [held] = claim(client)
    for _ in range(17):  # eight days and a half of heartbeats on the second one
        clock.advance(hours=12)
        assert client.post(f"/tasks/{held['id']}/heartbeat").status_code == 200
    assert forget_old_tasks(app) == 1
    assert client.post(f"/tasks/{old['id']}/complete").status_code == 404
    assert body(client.get("/state-machines/jobs/labels/done-long-ago/tasks"))["tasks"] == []
    assert client.post(f"/tasks/{held['id']}/complete").status_code == 200


def test_task_ids_name_their_label_shard_and_ids_issued_before_still_work(
    client: Client, db_engine: sa.Engine
) -> None:
    """A call made with a task id runs on its label's shard (Citus); older ids hold no key."""
    create(client, "jobs", "a")
    create(client, "jobs", "b")
    first, second = claim(client, limit=2)
    for task in (first, second):
        assert task["id"].startswith(f"{shard_key(task['label'])}.")
    old = second["id"].partition(".")[2]  # as issued before migration 0017
    with db_engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE labels SET task_id = :old WHERE task_id = :new"),
            {"old": old, "new": second["id"]},
        )
        conn.execute(
            sa.text("UPDATE tasks SET id = :old WHERE id = :new"), {"old": old, "new": second["id"]}
        )
    for task_id in (first["id"], old):
        assert client.post(f"/tasks/{task_id}/heartbeat").status_code == 200
        assert body(client.post(f"/tasks/{task_id}/complete")).get("state") == "check"
        assert client.post(f"/tasks/{task_id}/heartbeat").status_code == 409
    assert client.post(f"/tasks/{shard_key('a')}.never-issued/heartbeat").status_code == 404
