"""``routemaster serve`` runs the API and one worker, as 1.x did; ``--no-worker`` the API only.

Real processes: ``serve`` on a free port, its process tree read from
``/proc``, a real webhook receiver on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from tests.serving import serve_process
from tests.stub_server import StubServer, running_stub
from tests.waiting import wait_answering, wait_until

REPOSITORY = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the tree in /proc"),
]

CONFIG = """
state_machines:
  serve_tree:
    states:
      - gate: start
        triggers: [{event: entry}]
        exit_condition: metadata.go = true
        next: notify
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: done
      - gate: done
        exit_condition: false
"""


@pytest.fixture(autouse=True)
def emptied_database(db_engine: sa.Engine) -> None:
    """Tables emptied before and after each test: labels left in this config's states would
    make a later test's ``serve`` (another config) refuse to start, as stranded."""


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from running_stub()


def _descendants(root: int) -> dict[int, str]:
    """Every process below ``root``: pid to command line."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # it ended meanwhile
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                try:
                    found[pid] = (
                        Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    )
                except OSError:
                    continue
                frontier.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _workers(tree: dict[int, str]) -> list[int]:
    return [pid for pid, command in tree.items() if " cron" in command]


@contextmanager
def _serving(
    tmp_path: Path, database_url: str, stub: StubServer, *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    log = tmp_path / "serve.log"
    with serve_process(
        config,
        database_url,
        "--workers",
        "2",
        *args,
        env={"ROUTEMASTER_POLL_INTERVAL": "0.2"},
        with_worker=True,
        log=log,
    ) as (process, base):
        yield process, base, log


def test_serve_alone_runs_one_worker_that_moves_labels_and_sigterm_stops_the_whole_tree(
    tmp_path: Path, database_url: str, stub: StubServer
) -> None:
    with _serving(tmp_path, database_url, stub) as (process, base, log):
        tree = _descendants(process.pid)
        assert len(_workers(tree)) == 1, tree  # one, whatever --workers says
        labels = f"{base}/state-machines/serve_tree/labels"
        assert requests.post(f"{labels}/a%2Fb", json={"metadata": {"go": True}}).status_code == 201
        wait_until(
            lambda: requests.get(f"{labels}/a%2Fb", timeout=5).json()["state"] == "done",
            "the label moved through the action by serve's worker",
            timeout=20,
        )
        assert [request.path for request in stub.received()] == ["/hook/a%2Fb"]
        # The worker's own metrics at the API's /metrics: one directory for the whole tree.
        delivered = (
            'routemaster_webhook_calls_total{outcome="success",'
            'state="notify",state_machine="serve_tree"} 1.0'
        )
        assert delivered in requests.get(base + "/metrics", timeout=5).text.splitlines()
        wait_until(lambda: len(_descendants(process.pid)) >= 4, "gunicorn's 2 workers booted")
        tree = _descendants(process.pid)  # the API, its 2 workers, the worker
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0, log.read_text()
    assert [pid for pid in tree if _alive(pid)] == [], tree  # no orphan, no worker left behind
    output = log.read_text()
    assert "the worker stopped (exit code 0)" in output
    assert "the API stopped (exit code 0)" in output
    # The start-up check (schema, stranded labels, versions) ran once, in serve itself: the
    # API and the worker trust it (one migration's lines, not three).
    assert output.count("Will assume transactional DDL") == 1, output


def test_serve_no_worker_runs_the_api_only(
    tmp_path: Path, database_url: str, stub: StubServer
) -> None:
    with _serving(tmp_path, database_url, stub, "--no-worker") as (process, base, log):
        # gunicorn itself, with its two workers below it, and nothing else
        def booted() -> dict[int, str] | None:
            found = _descendants(process.pid)
            return found if len(found) >= 2 else None

        tree = wait_until(booted, "gunicorn's 2 workers booted")
        assert len(tree) == 2 and _workers(tree) == [], tree
        assert all(" serve " in command for command in tree.values())
        labels = f"{base}/state-machines/serve_tree/labels"
        assert requests.post(f"{labels}/x", json={"metadata": {"go": True}}).status_code == 201
        assert requests.get(f"{labels}/x", timeout=5).json()["state"] == "notify"
    assert process.returncode == 0
    output = log.read_text()
    assert "started the worker" not in output and "routemaster.worker" not in output


def test_serve_exits_1_and_stops_the_api_when_its_worker_dies(
    tmp_path: Path, database_url: str, stub: StubServer
) -> None:
    with _serving(tmp_path, database_url, stub) as (process, base, log):
        [worker] = _workers(_descendants(process.pid))
        tree = _descendants(process.pid)
        os.kill(worker, signal.SIGKILL)
        code = process.wait(timeout=30)
    assert code == 1
    assert f"the worker (pid {worker}) ended unexpectedly (signal 9)" in log.read_text()
    assert [pid for pid in tree if _alive(pid)] == [], tree
    with pytest.raises(requests.ConnectionError):
        requests.get(base + "/", timeout=5)


def test_sighup_reloads_the_api_and_leaves_the_worker_alone(
    tmp_path: Path, database_url: str, stub: StubServer
) -> None:
    with _serving(tmp_path, database_url, stub) as (process, base, log):
        [worker] = _workers(_descendants(process.pid))
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: "Handling signal: hup" in log.read_text(), "gunicorn reloading")
        wait_answering(base + "/", process)
        assert process.poll() is None
        assert _workers(_descendants(process.pid)) == [worker]  # the same worker, still running
