"""Pull workers against the real ``routemaster serve``: waiting claims hold no request worker,
and the consumer the guide shows works as written."""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from tests.api.tasks_support import CONFIG
from tests.serving import REPOSITORY, serving
from tests.waiting import wait_until

WAITING = 200


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def server(config_path: Path, database_url: str, db_engine: sa.Engine) -> Iterator[str]:
    with serving(config_path, database_url, "--workers", "2") as base:
        yield base


def open_claim(base: str, **fields: object) -> socket.socket:
    """A claim sent on a raw connection, its answer left for :func:`read_answer`."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    body = json.dumps({"worker": "w", **fields}).encode()
    sock.sendall(
        b"POST /tasks/claim HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def claims_answered(base: str) -> float:
    """How many claim requests the request workers have finished with (from /metrics)."""
    text = requests.get(f"{base}/metrics", timeout=5).text
    pattern = r'routemaster_http_requests_total\{[^}]*endpoint="/tasks/claim"[^}]*\} (\S+)'
    return sum(float(value) for value in re.findall(pattern, text))


def read_answer(sock: socket.socket) -> tuple[str, dict[str, str], object]:
    """Status line, headers and JSON body of an answer that ends when the server closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)
    }
    return status, headers, json.loads(body)


def test_waiting_claims_leave_the_request_workers_free(server: str) -> None:
    claims = [open_claim(server, wait=30) for _ in range(WAITING)]
    try:
        # Every claim has been through a request worker and is now waiting.
        wait_until(
            lambda: claims_answered(server) >= WAITING,
            "every claim taken by a request worker",
            timeout=20,
        )
        for n in range(20):
            # the claims wait 30 s: a read queued behind them would time out
            assert requests.get(f"{server}/state-machines", timeout=10).status_code == 200, n
        for n in range(3):
            response = requests.post(
                f"{server}/state-machines/jobs/labels/l{n}", json={"metadata": {}}, timeout=5
            )
            assert response.status_code == 201
        answered: list[socket.socket] = []

        def three_answered() -> bool:
            ready, _, _ = select.select([c for c in claims if c not in answered], [], [], 0.5)
            answered.extend(ready)
            return len(answered) >= 3

        wait_until(three_answered, "three waiting claims answered", timeout=10)
        labels = []
        for sock in answered:
            status, headers, body = read_answer(sock)
            assert status == "HTTP/1.1 200 OK"
            assert "content-length" not in headers
            assert headers["connection"] == "close"
            assert headers["content-type"] == "application/json"
            assert isinstance(body, dict)
            labels += [task["label"] for task in body["tasks"]]
        assert sorted(labels) == ["l0", "l1", "l2"]
    finally:
        for sock in claims:
            sock.close()


def test_a_waiting_claim_with_nothing_to_do_answers_empty(server: str) -> None:
    started = time.monotonic()
    status, _, body = read_answer(open_claim(server, wait=1))
    assert status == "HTTP/1.1 200 OK"
    assert body == {"tasks": []}
    assert 1 <= time.monotonic() - started < 6


def test_a_claim_whose_client_hangs_up_is_answered_at_once_and_claims_nothing(
    server: str,
) -> None:
    before = claims_answered(server)
    sock = open_claim(server, wait=30)
    wait_until(lambda: claims_answered(server) > before, "the claim waiting")
    sock.shutdown(socket.SHUT_WR)  # a worker shutting down: it wants nothing more
    started = time.monotonic()
    status, _, body = read_answer(sock)
    assert (status, body) == ("HTTP/1.1 200 OK", {"tasks": []})
    assert time.monotonic() - started < 10
    created = requests.post(f"{server}/state-machines/jobs/labels/later", json={"metadata": {}})
    assert created.status_code == 201
    tasks = requests.get(f"{server}/state-machines/jobs/labels/later/tasks", timeout=5).json()
    assert tasks == {"tasks": []}  # nothing was claimed for the client that left


def consumer_from_the_guide() -> str:
    guide = (REPOSITORY / "docs" / "pull-workers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL)
    [program] = [str(block) for block in blocks if "/tasks/claim" in block]
    return program


def test_the_consumer_in_the_guide_works_as_written(server: str, tmp_path: Path) -> None:
    program = tmp_path / "consumer.py"
    program.write_text(consumer_from_the_guide())
    consumers = [
        subprocess.Popen(
            [sys.executable, str(program)],
            env={**os.environ, "ROUTEMASTER_URL": server},
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    names = [f"video-{n}" for n in range(20)]
    try:
        for name in names:
            response = requests.post(
                f"{server}/state-machines/jobs/labels/{name}", json={"metadata": {}}, timeout=5
            )
            assert response.status_code == 201

        def all_done() -> bool:
            states = [
                requests.get(f"{server}/state-machines/jobs/labels/{name}", timeout=5).json()
                for name in names
            ]
            return all(label["state"] == "check" for label in states)

        wait_until(all_done, "the consumers completing every task", timeout=20)
        label = requests.get(f"{server}/state-machines/jobs/labels/video-7", timeout=5).json()
        assert label["metadata"] == {"transcoded": True, "size": len("video-7")}
    finally:
        for consumer in consumers:
            consumer.terminate()
            _, errors = consumer.communicate(timeout=10)
            assert b"Traceback" not in errors or b"KeyboardInterrupt" in errors, errors


SHORT_LEASE = """
state_machines:
  jobs:
    retry: {max_attempts: 3, initial_delay: 1s, max_delay: 1s}
    states:
      - action: process
        worker: {lease: 1s}
        next: done
      - gate: done
        exit_condition: false
"""

CLAIM_AND_HANG = """
import sys, time, requests
answer = requests.post(sys.argv[1] + "/tasks/claim", json={"worker": "doomed", "wait": 10})
print(answer.json()["tasks"][0]["id"], flush=True)
time.sleep(600)
"""


def test_a_killed_workers_label_goes_to_another_worker_and_its_late_completion_is_refused(
    tmp_path: Path, database_url: str, db_engine: sa.Engine
) -> None:
    config = tmp_path / "short.yaml"
    config.write_text(SHORT_LEASE)
    script = tmp_path / "doomed.py"
    script.write_text(CLAIM_AND_HANG)
    with serving(config, database_url, "--workers", "1") as base:
        created = requests.post(f"{base}/state-machines/jobs/labels/a", json={"metadata": {}})
        assert created.status_code == 201
        doomed = subprocess.Popen(
            [sys.executable, str(script), base], stdout=subprocess.PIPE, cwd=tmp_path
        )
        assert doomed.stdout is not None
        first_id = doomed.stdout.readline().decode().strip()
        doomed.kill()  # mid-task: it never completes, fails or heartbeats
        doomed.wait()
        doomed.stdout.close()

        def claimed_again() -> list[dict[str, object]]:
            answer = requests.post(
                f"{base}/tasks/claim", json={"worker": "survivor", "wait": 2}, timeout=10
            )
            tasks: list[dict[str, object]] = answer.json()["tasks"]
            return tasks

        # the lease runs out, then the backoff
        second = wait_until(claimed_again, "the label claimed by another worker", timeout=15)
        assert [(task["label"], task["attempt"]) for task in second] == [("a", 2)]
        late = requests.post(f"{base}/tasks/{first_id}/complete", json={}, timeout=5)
        assert (late.status_code, late.json()["reason"]) == (409, "lease_lost")
        done = requests.post(f"{base}/tasks/{second[0]['id']}/complete", json={}, timeout=5)
        assert done.json()["state"] == "done"
