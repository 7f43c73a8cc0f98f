"""Wake-ups with ``DATABASE_URL`` alone (SPEC F3): no direct URL, no other setting.

A ``cron`` given PostgreSQL itself listens on it once its probe came back
(``routemaster_wakeups_listening`` 1) and calls a label's webhook as soon as
the label enters the action, far within its 10 s poll interval. Given
PgBouncer in transaction mode, its check finds that notifications never
arrive, it says so (the gauge 0, one log line) and polls: the call comes
within the poll interval.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.plumbing.database import create_engine
from tests.pooler import running_pgbouncer
from tests.serving import REPOSITORY, free_port, stop
from tests.stub_server import StubServer
from tests.waiting import wait_until
from tests.worker.notify import create, notify_config

PROMPTLY = 2.0  # seconds: a woken worker's call, with room for a busy machine
POLLED_LOG = "wake-ups polled: LISTEN on this database URL delivers no notifications"


@contextlib.contextmanager
def _cron(
    config: Path, url: str, poll: float, log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``cron`` given only ``DATABASE_URL=url``; yields it and its metrics' URL."""
    port = free_port()
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DB_", "ROUTEMASTER_")) and key != "PROMETHEUS_MULTIPROC_DIR"
    }
    environment.update(DATABASE_URL=url, ROUTEMASTER_POLL_INTERVAL=str(poll))
    command = [sys.executable, "-m", "routemaster", "-c", str(config), "cron"]
    command += ["--metrics-bind", f"127.0.0.1:{port}"]
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=REPOSITORY, env=environment, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        yield process, f"http://127.0.0.1:{port}/metrics"
    finally:
        stop(process)


def _listening(metrics: str) -> float | None:
    """The worker's ``routemaster_wakeups_listening``, or ``None`` while it cannot be read."""
    try:
        with urllib.request.urlopen(metrics, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "routemaster_wakeups_listening"
                and sample.labels.get("listener") == "worker"
            ):
                return sample.value
    return None


def _config(tmp_path: Path, stub: StubServer) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(notify_config().replace("{stub}", stub.url("")))
    return path


def _called_after_entering(app: App, stub: StubServer, name: str, within: float) -> float:
    """Seconds from the label entering the action (created in it) to its webhook call."""
    entered = time.monotonic()
    create(app, name)
    wait_until(lambda: stub.received(f"/hook/{name}"), f"{name}'s call", timeout=within)
    return time.monotonic() - entered


@pytest.mark.slow
def test_with_the_database_url_alone_an_action_is_called_at_once(
    direct_database_url: str, db_engine: sa.Engine, stub: StubServer, tmp_path: Path
) -> None:
    config = _config(tmp_path, stub)
    log = tmp_path / "cron.log"
    engine = create_engine(direct_database_url)
    app = App(config=load_config([config]), db=engine)
    try:
        with _cron(config, direct_database_url, 10.0, log) as (process, metrics):

            def listening() -> bool:
                assert process.poll() is None, log.read_text()
                return _listening(metrics) == 1

            wait_until(listening, lambda: log.read_text(), timeout=60, every=0.1)
            for name in ("a", "b", "c"):
                assert _called_after_entering(app, stub, name, within=10) < PROMPTLY
        assert "wake-ups by LISTEN" in log.read_text()
    finally:
        engine.dispose()


@pytest.mark.slow
def test_through_pgbouncer_in_transaction_mode_the_check_fails_and_wake_ups_are_polled(
    direct_database_url: str, db_engine: sa.Engine, stub: StubServer, tmp_path: Path
) -> None:
    poll = 2.0
    config = _config(tmp_path, stub)
    log = tmp_path / "cron.log"
    with running_pgbouncer(direct_database_url, pool_size=5) as url:
        engine = create_engine(url)
        app = App(config=load_config([config]), db=engine)
        try:
            with _cron(config, url, poll, log) as (process, metrics):

                def checked() -> bool:
                    assert process.poll() is None, log.read_text()
                    return POLLED_LOG in log.read_text()

                wait_until(checked, lambda: log.read_text(), timeout=60, every=0.1)
                assert _listening(metrics) == 0
                took = _called_after_entering(app, stub, "a", within=poll + 5)
                assert took < poll + PROMPTLY
                assert _listening(metrics) == 0
        finally:
            engine.dispose()
