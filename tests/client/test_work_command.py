"""``routemaster work`` as a process: SIGTERM drains and exits 0 with nothing leased; a second
signal stops it at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.client.support import create, label, leased, machine_file, tasks_of
from tests.serving import REPOSITORY, serving
from tests.waiting import wait_until

HANDLERS = """
import time
from pathlib import Path

def handle(task):
    Path(f"started-{task.label}").touch()
    time.sleep(task.metadata["seconds"])
    return {"slept": task.metadata["seconds"]}
"""


@pytest.fixture
def server(tmp_path: Path, database_url: str, db_engine: sa.Engine) -> Iterator[str]:
    with serving(machine_file(tmp_path), database_url) as base:
        yield base


def work(base: str, directory: Path, *options: str) -> subprocess.Popen[bytes]:
    (directory / "handlers.py").write_text(HANDLERS)
    command = [sys.executable, "-m", "routemaster", "work", "--url", base]
    command += ["--state-machine", "jobs", "--state", "work", "--wait", "1", *options]
    environment = {key: value for key, value in os.environ.items() if key != "ROUTEMASTER_TOKEN"}
    environment["PYTHONPATH"] = str(REPOSITORY)
    return subprocess.Popen(
        [*command, "handlers:handle"],
        cwd=directory,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@contextmanager
def reaped(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """The process killed if the block leaves it running (a wait that failed)."""
    try:
        yield
    finally:
        if process.poll() is None:
            process.kill()


def stopped(process: subprocess.Popen[bytes], *signals: signal.Signals, timeout: float) -> bytes:
    """Sends ``signals`` in turn; the output, once the process exits within ``timeout`` s."""
    for signum in signals:
        process.send_signal(signum)
    output, _ = process.communicate(timeout=timeout)
    return output


def started(directory: Path) -> set[str]:
    return {path.name.removeprefix("started-") for path in directory.glob("started-*")}


def test_sigterm_lets_running_handlers_finish_and_exits_0_with_nothing_leased(
    server: str, tmp_path: Path
) -> None:
    process = work(server, tmp_path, "--concurrency", "2", "--grace", "30")
    names = ["a", "b", "c", "d"]
    with reaped(process):
        create(server, names, {"seconds": 1.5})
        wait_until(lambda: len(started(tmp_path)) == 2, "two handlers running", timeout=20)
        output = stopped(process, signal.SIGTERM, timeout=30)
    assert process.returncode == 0, output.decode()
    assert b"draining" in output and b"drained" in output
    running = started(tmp_path)
    assert len(running) == 2  # nothing claimed after the signal
    assert {name: label(server, name)["state"] for name in names} == {
        name: "done" if name in running else "work" for name in names
    }
    assert leased(server, names) == []
    for name in running:
        assert [t["outcome"] for t in tasks_of(server, name)] == ["completed"]


def test_a_second_signal_stops_at_once(server: str, tmp_path: Path) -> None:
    process = work(server, tmp_path, "--concurrency", "1", "--grace", "60")
    with reaped(process):
        create(server, ["endless"], {"seconds": 600})
        wait_until(lambda: started(tmp_path) == {"endless"}, "the handler running", timeout=20)
        # SIGTERM: draining, the handler would get 60 s; then SIGINT
        output = stopped(process, signal.SIGTERM, signal.SIGINT, timeout=10)
    assert process.returncode == 1, output.decode()
    assert b"again: stopping at once" in output
    # the lease is left to run out: the service offers the label again then
    assert leased(server, ["endless"]) == ["endless"]


def test_a_refused_claim_is_a_clear_error(server: str, tmp_path: Path) -> None:
    process = work(server, tmp_path, "--state", "done")
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 1, output.decode()
    assert b"no pull action" in output


def test_the_client_example_in_the_guide_works_as_written(server: str, tmp_path: Path) -> None:
    guide = (REPOSITORY / "docs" / "pull-workers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL)
    [example] = [block for block in blocks if "from routemaster.client import" in block]
    program = tmp_path / "transcoder.py"
    program.write_text(
        example.replace("http://routemaster:2017", server)
        .replace('"videos"', '"jobs"')
        .replace('"transcode"', '"work"')
    )
    environment = {key: value for key, value in os.environ.items() if key != "ROUTEMASTER_TOKEN"}
    process = subprocess.Popen(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    with reaped(process):
        create(server, ["cat.mp4"])
        create(server, ["broken.mp4"], {"codec": "unknown"})
        wait_until(lambda: label(server, "cat.mp4")["state"] == "done", "done", timeout=20)
        wait_until(lambda: label(server, "broken.mp4")["errored"], "errored", timeout=20)
        output = stopped(process, signal.SIGTERM, timeout=30)
    assert process.returncode == 0, output.decode()
    token = tasks_of(server, "cat.mp4")[0]["idempotency_token"]
    assert label(server, "cat.mp4")["metadata"] == {
        "transcoded": True,
        "output": f"/videos/{token}.mp4",
    }
    assert "unknown codec" in label(server, "broken.mp4")["last_error"]
