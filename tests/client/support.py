"""What the client's tests share: a machine with one pull action, labels made and read over
HTTP, a worker run on a thread, and a handler that records what it was given."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from routemaster.client import Task, Worker

MACHINE = """
state_machines:
  jobs:
    retry: {{max_attempts: 3, initial_delay: 1s, max_delay: 1s}}
    states:
      - action: work
        worker: {{lease: {lease}}}
        next: done
      - gate: done
        exit_condition: false
"""


def machine_file(directory: Path, lease: str = "30s") -> Path:
    path = directory / "jobs.yaml"
    path.write_text(MACHINE.format(lease=lease))
    return path


def create(base: str, names: list[str], metadata: dict[str, Any] | None = None) -> None:
    with requests.Session() as session:
        for name in names:
            response = session.post(
                f"{base}/state-machines/jobs/labels/{name}",
                json={"metadata": metadata or {}},
                timeout=10,
            )
            assert response.status_code == 201, response.text


def label(base: str, name: str) -> dict[str, Any]:
    response = requests.get(f"{base}/state-machines/jobs/labels/{name}", timeout=10)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def states(base: str, names: list[str]) -> Counter[str]:
    return Counter(label(base, name)["state"] for name in names)


def done(base: str, names: list[str]) -> int:
    """How many of ``names`` are in ``done`` (0 while the service cannot say)."""
    with requests.Session() as session:
        found = [session.get(f"{base}/state-machines/jobs/labels/{n}", timeout=10) for n in names]
    if any(response.status_code != 200 for response in found):
        return 0
    return sum(response.json()["state"] == "done" for response in found)


def tasks_of(base: str, name: str) -> list[dict[str, Any]]:
    response = requests.get(f"{base}/state-machines/jobs/labels/{name}/tasks", timeout=10)
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


def leased(base: str, names: list[str]) -> list[str]:
    """The labels a task still holds (claimed, not ended)."""
    return [name for name in names if any(t["ended_at"] is None for t in tasks_of(base, name))]


class Recorder:
    """A handler's calls: every task it was given, by label, and its outcome."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[Task] = []
        self.finished: list[Task] = []

    def started(self, task: Task) -> None:
        with self.lock:
            self.calls.append(task)

    def done(self, task: Task) -> None:
        with self.lock:
            self.finished.append(task)

    def per_label(self) -> Counter[str]:
        with self.lock:
            return Counter(task.label for task in self.calls)


def recording_worker(base: str, recorder: Recorder, *, name: str, pause: float = 0.05) -> Worker:
    """A worker on ``jobs``/``work``: its handler records each task, takes ``pause`` seconds,
    and writes its ``name`` into the label's metadata (``handled_by``)."""
    worker = Worker(base, state_machine="jobs", state="work", concurrency=4, wait=2, name=name)

    @worker.task
    def handle(task: Task) -> dict[str, Any]:
        recorder.started(task)
        time.sleep(pause)
        recorder.done(task)
        return {"handled_by": name}

    return worker


@contextmanager
def running(worker: Worker) -> Iterator[threading.Thread]:
    """``worker.run()`` on a thread until the block ends (then drained and joined)."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not drain"
