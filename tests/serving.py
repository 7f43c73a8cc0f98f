"""The real service in a subprocess: ``routemaster serve`` (and ``cron``) on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.waiting import wait_answering

REPOSITORY = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serving(
    config: Path,
    database_url: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    with_worker: bool = False,
    layers: Sequence[Path] = (),
) -> Iterator[str]:
    """``serve`` (and, with ``with_worker``, ``cron``) until the block ends; yields the base URL."""
    port = free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DB_")}
    environment.update(env or {})
    environment["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "routemaster", "-c", str(config)]
    for layer in layers:
        command += ["-c", str(layer)]
    processes = [
        subprocess.Popen(
            [*command, "serve", "-b", f"127.0.0.1:{port}", *args],
            cwd=REPOSITORY,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    ]
    if with_worker:
        processes.append(
            subprocess.Popen(
                [*command, "cron"],
                cwd=REPOSITORY,
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_answering(base + "/", processes[0])
        yield base
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()
