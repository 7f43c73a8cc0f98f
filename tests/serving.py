"""The real service in a subprocess: ``routemaster serve`` on a free port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.waiting import wait_answering

REPOSITORY = Path(__file__).resolve().parents[1]


def stop_all(processes: Iterable[subprocess.Popen[bytes]], timeout: float = 30) -> None:
    """SIGTERM every one still running, then wait for each; one still there after ``timeout`` s
    is killed."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """:func:`stop_all` for one process."""
    stop_all([process], timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def session_environment(database_url: str) -> dict[str, str]:
    """What a process needs to reach ``database_url`` as this test session's own would: in a
    direct run, the same URL as the (optional) direct URL; in a run through PgBouncer
    (``ROUTEMASTER_TEST_POOLER``), no direct URL, so wake-ups are polled."""
    pooled = os.environ.get("ROUTEMASTER_TEST_POOLER", "") not in ("", "0")
    return {"ROUTEMASTER_DIRECT_DATABASE_URL": "" if pooled else database_url}


@contextmanager
def serve_process(
    config: Path,
    database_url: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    with_worker: bool = False,
    layers: Sequence[Path] = (),
    log: Path | None = None,
    port: int | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``serve`` until the block ends, once it answers; yields the process and the base URL.

    On ``port`` when given (a restart on the same address), else on a free one.

    Without ``with_worker``, ``serve --no-worker``: the API alone, so labels stay where
    the API leaves them. With it, ``serve`` as a 1.x deployment runs it: the API and its worker.
    Its output goes to ``log`` when given.
    """
    port = port or free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DB_")}
    environment.update(session_environment(database_url))
    environment.update(env or {})
    environment["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "routemaster", "-c", str(config)]
    for layer in layers:
        command += ["-c", str(layer)]
    command += ["serve", "-b", f"127.0.0.1:{port}", *args]
    if not with_worker:
        command.append("--no-worker")
    with contextlib.ExitStack() as files:
        output = subprocess.DEVNULL if log is None else files.enter_context(log.open("wb"))
        process = subprocess.Popen(
            command,
            cwd=REPOSITORY,
            env=environment,
            stdout=output,
            stderr=subprocess.DEVNULL if log is None else subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_answering(base + "/", process)
        yield process, base
    finally:
        stop(process)


@contextmanager
def serving(
    config: Path,
    database_url: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    with_worker: bool = False,
    layers: Sequence[Path] = (),
) -> Iterator[str]:
    """:func:`serve_process`, yielding only the base URL."""
    with serve_process(
        config, database_url, *args, env=env, with_worker=with_worker, layers=layers
    ) as (_, base):
        yield base
