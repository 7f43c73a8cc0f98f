"""``serve``'s supervisor under Ctrl-C: each child is told once, and a second Ctrl-C kills at once.

Real processes, no database: a supervisor with two children that stand for the
API and the worker. Each child starts a process of its own (as gunicorn starts
its workers) and, on SIGINT or SIGTERM, only says so and runs on, as a worker
does while its webhook calls finish. Ctrl-C is ``killpg`` of the supervisor's
group, as a terminal sends it to its foreground group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path("/proc/self/stat").exists(), reason="reads process states in /proc"
    ),
]

SUPERVISOR = """
import logging, sys
from routemaster.server.supervisor import Child, supervise
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
child = [sys.executable, "-c", sys.argv[1]]
sys.exit(supervise([Child("API", child, takes_api_signals=True), Child("worker", child)]))
"""

CHILD = """
import os, signal, subprocess, sys
def told(signum, frame):
    print(f"{os.getpid()} got signal {signum}", flush=True)
signal.signal(signal.SIGINT, told)
signal.signal(signal.SIGTERM, told)
below = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready {os.getpid()} {os.getpgid(0)} {below.pid}", flush=True)
while True:
    signal.pause()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextmanager
def _supervising(
    tmp_path: Path, child: str = CHILD
) -> Iterator[tuple[subprocess.Popen[bytes], Path, list[int]]]:
    """The supervisor in a session of its own; its children's and theirs' pids once ready."""
    log = tmp_path / "supervisor.log"
    repository = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repository}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, child],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    pids: list[int] = []
    try:
        ready = wait_until(
            lambda: (
                [line.split() for line in log.read_text().splitlines() if "ready" in line]
                if log.read_text().count("ready") == 2
                else None
            ),
            lambda: log.read_text(),
            timeout=60,
        )
        for _, pid, pgid, below in ready:
            assert int(pgid) == int(pid), "a child in a process group of its own"
            pids += {int(pid), int(below)}
        yield process, log, pids
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for left in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(left, signal.SIGKILL)


def test_a_ctrl_c_reaches_each_child_once_and_a_second_kills_the_whole_tree_at_once(
    tmp_path: Path,
) -> None:
    with _supervising(tmp_path) as (process, log, pids):
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
        wait_until(
            lambda: log.read_text().count(f"got signal {signal.SIGTERM}") == 2,
            lambda: log.read_text(),
        )
        assert process.poll() is None  # both children still finishing their work
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C again: at once
        code = process.wait(timeout=30)
        output = log.read_text()
        assert code == 1, output
        assert "received signal 2 again, killing the API and the worker" in output
        wait_until(lambda: not any(_alive(pid) for pid in pids), "no process left behind")
    # Told by the supervisor alone, once: not by the terminal too, nor by the second Ctrl-C.
    assert log.read_text().count(f"got signal {signal.SIGTERM}") == 2, log.read_text()


STARTING = """
import os, time
import click

@click.command()
def start() -> None:  # a routemaster command before it sets any handler of its own
    print(f"ready {os.getpid()} {os.getpgid(0)} {os.getpid()}", flush=True)
    time.sleep(600)

start()
"""


def test_a_ctrl_c_while_the_children_are_still_starting_is_a_clean_stop(tmp_path: Path) -> None:
    """Passed on as SIGINT, it was click's KeyboardInterrupt in a child still loading:
    "Aborted!", exit 1, and ``serve`` exited 1 for a Ctrl-C."""
    with _supervising(tmp_path, STARTING) as (process, log, _):
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
        code = process.wait(timeout=30)
    assert code == 0, log.read_text()
    assert "Aborted!" not in log.read_text()
