"""``routemaster.client.Worker`` against the real ``routemaster serve``: every task handled once
across a drain and a takeover, leases kept by heartbeats, failures as the handler says."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from routemaster.client import Fail, Task, Worker
from tests.client.support import (
    Recorder,
    create,
    label,
    leased,
    machine_file,
    recording_worker,
    running,
    states,
    tasks_of,
)
from tests.serving import serving
from tests.waiting import wait_until


@pytest.fixture
def server(tmp_path: Path, database_url: str, db_engine: sa.Engine) -> Iterator[str]:
    with serving(machine_file(tmp_path), database_url) as base:
        yield base


def test_every_task_is_handled_once_across_a_drain_and_a_second_worker(server: str) -> None:
    names = [f"job-{n}" for n in range(40)]
    recorder = Recorder()
    first = recording_worker(server, recorder, name="first", pause=0.1)
    with running(first):
        create(server, names)
        wait_until(lambda: len(recorder.finished) >= 10, "the first worker handling ten")
    # drained: whatever it started has finished and landed, nothing is still leased
    assert len(recorder.finished) == len(recorder.calls)
    assert leased(server, names) == []
    handled_first = sum(states(server, names)["done"] for _ in [0])
    assert handled_first == len(recorder.calls)

    second = recording_worker(server, recorder, name="second")
    with running(second):
        wait_until(lambda: states(server, names)["done"] == 40, "every label done", timeout=30)
    assert recorder.per_label() == {name: 1 for name in names}
    assert {task.attempt for task in recorder.calls} == {1}
    by = {label(server, name)["metadata"]["handled_by"] for name in names}
    assert by == {"first", "second"}


def test_a_handler_still_running_after_the_grace_is_released_and_its_result_dropped(
    server: str,
) -> None:
    unblock = threading.Event()
    calls: list[Task] = []
    first = Worker(server, state_machine="jobs", concurrency=2, grace=0.2, wait=1, name="first")

    @first.task
    def stuck(task: Task) -> dict[str, Any]:
        calls.append(task)
        unblock.wait(30)
        return {"handled_by": "first"}

    with running(first):
        create(server, ["slow"])
        wait_until(lambda: calls, "the handler started")
    assert leased(server, ["slow"]) == []  # released, not left to run out
    unblock.set()  # the first handler returns now: its result must not land
    second = Worker(server, state_machine="jobs", concurrency=1, wait=1, name="second")
    retaken: list[Task] = []

    @second.task
    def handle(task: Task) -> dict[str, Any]:
        retaken.append(task)
        return {"handled_by": "second"}

    with running(second):
        wait_until(lambda: label(server, "slow")["state"] == "done", "the second worker")
    assert [task.attempt for task in retaken] == [1]  # a release counts no attempt
    assert label(server, "slow")["metadata"] == {"handled_by": "second"}
    assert [t["outcome"] for t in tasks_of(server, "slow")] == ["released", "completed"]


def test_heartbeats_keep_a_handler_slower_than_its_lease(
    tmp_path: Path, database_url: str, db_engine: sa.Engine
) -> None:
    with serving(machine_file(tmp_path, lease="1s"), database_url) as base:
        worker = Worker(base, state_machine="jobs", state="work", concurrency=2, wait=1)
        calls: list[Task] = []

        @worker.task
        def slow(task: Task) -> dict[str, Any]:
            calls.append(task)
            time.sleep(3.5)  # the work itself: three and a half leases long
            return {"slow": True}

        with running(worker):
            create(base, ["long"])
            wait_until(lambda: label(base, "long")["state"] == "done", "done", timeout=20)
        assert [task.attempt for task in calls] == [1]
        assert label(base, "long")["metadata"] == {"slow": True}
        assert [t["outcome"] for t in tasks_of(base, "long")] == ["completed"]


def test_fail_without_retry_errors_the_label_with_its_message_and_other_errors_retry(
    server: str,
) -> None:
    worker = Worker(server, state_machine="jobs", state="work", concurrency=2, wait=1)
    attempts: list[int] = []

    @worker.task
    def picky(task: Task) -> dict[str, Any]:
        attempts.append(task.attempt)
        if task.attempt == 1:
            raise ConnectionError("the warehouse did not answer")  # retried
        raise Fail("out of stock", retry=False)

    with running(worker):
        create(server, ["order"])
        wait_until(lambda: label(server, "order")["errored"], "the label errored", timeout=20)
    found = label(server, "order")
    assert found["state"] == "work"
    assert "out of stock" in found["last_error"]
    assert attempts == [1, 2]
    assert [t["outcome"] for t in tasks_of(server, "order")] == ["failed", "failed"]


def test_a_lost_lease_drops_the_handlers_result_without_raising_into_it(
    tmp_path: Path, database_url: str, db_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with serving(machine_file(tmp_path, lease="3s"), database_url) as base:
        worker = Worker(base, state_machine="jobs", state="work", concurrency=1, wait=1)
        calls: list[Task] = []
        saw_it_lost: list[bool] = []

        @worker.task
        def handle(task: Task) -> dict[str, Any]:
            calls.append(task)
            wait_until(lambda: task.lease_lost, "the next heartbeat refused", timeout=20)
            saw_it_lost.append(True)
            return {"late": True}

        with running(worker):
            create(base, ["moved"])
            wait_until(lambda: calls, "the handler started")
            moved = requests.post(
                f"{base}/state-machines/jobs/labels/moved/move",
                json={"state": "done", "reason": "an operator"},
                timeout=10,
            )
            assert moved.status_code == 200, moved.text
            wait_until(lambda: saw_it_lost, "the handler seeing its lease lost", timeout=20)
            wait_until(lambda: "result is dropped" in caplog.text, "the drop logged")
        assert len(calls) == 1  # called once, never again for that claim
        assert label(base, "moved")["metadata"] == {}  # the late result never landed
        assert label(base, "moved")["state"] == "done"
