"""Fixtures for the worker tests: a stub HTTP server and an App built from YAML."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.db.notifications import Listener
from routemaster.worker import Worker
from tests.serving import session_environment, stop_all
from tests.stub_server import StubServer
from tests.waiting import wait_until

MakeApp = Callable[..., App]


class FakeClock:
    """An injectable clock that only moves when told to."""

    def __init__(self, start: datetime.datetime) -> None:
        self.current = start

    def __call__(self) -> datetime.datetime:
        return self.current

    def advance(self, **delta: float) -> None:
        self.current += datetime.timedelta(**delta)


@pytest.fixture
def make_app(
    tmp_path: Path, db_engine: sa.Engine, direct_engine: sa.Engine | None, stub: StubServer
) -> Iterator[MakeApp]:
    """``make_app(yaml, **settings)``: ``{stub}`` in the YAML becomes the stub server's URL."""
    apps: list[App] = []

    def make(yaml_text: str, *, clock: Any = None, **settings: Any) -> App:
        path = tmp_path / f"config{len(apps)}.yaml"
        path.write_text(yaml_text.replace("{stub}", stub.url("")))
        settings.setdefault("poll_interval", 0.2)
        settings.setdefault("worker_id", f"test-worker-{len(apps)}")
        app = App(
            config=load_config([path]),
            db=db_engine,
            settings=Settings(**settings),
            direct=direct_engine,
        )
        if clock is not None:
            app.clock = clock
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.http.close()


@contextmanager
def running(app: App) -> Iterator[Worker]:
    """A worker running its real loop in a thread, stopped (gracefully) afterwards."""
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, name=_thread_name(worker), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the worker did not stop"


def _thread_name(worker: Worker) -> str:
    return f"worker-{id(worker)}"


def wait_asleep(worker: Worker, timeout: float = 10) -> None:
    """Until a :func:`running` worker's loop sleeps in its wait for work (``LISTEN``, slots)."""
    [thread] = [t for t in threading.enumerate() if t.name == _thread_name(worker)]

    def asleep() -> bool:
        frame = sys._current_frames().get(thread.ident or 0)
        while frame is not None:
            if frame.f_code is Listener.wait.__code__:
                return True
            frame = frame.f_back
        return False

    wait_until(asleep, "the worker asleep in its wait", timeout=timeout)


ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).with_name("launch_worker.py")


def worker_environment(database_url: str, **settings: object) -> dict[str, str]:
    """The environment of a worker process run from the repository: ``settings`` become
    ``ROUTEMASTER_*`` variables (polling every 0.2 s unless they say otherwise)."""
    settings = {"poll_interval": 0.2, **settings}
    return {
        **os.environ,
        **session_environment(database_url),
        "DATABASE_URL": database_url,
        "PYTHONPATH": str(ROOT),
        **{f"ROUTEMASTER_{name.upper()}": str(value) for name, value in settings.items()},
    }


class Workers:
    """Worker processes started for one test; all stopped at its end."""

    def __init__(self, database_url: str, config: Path, tmp_path: Path) -> None:
        self.database_url = database_url
        self.config = config
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(
        self, *, clock_offset: float | None = None, **settings: object
    ) -> subprocess.Popen[bytes]:
        env = worker_environment(self.database_url, worker_id=f"w{len(self.processes)}", **settings)
        args = [sys.executable, str(LAUNCHER), str(self.config)]
        if clock_offset is not None:
            args.append(str(clock_offset))
        with (self.tmp_path / f"worker{len(self.processes)}.log").open("wb") as log:
            process = subprocess.Popen(
                args, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        return process

    def logs(self) -> list[str]:
        return [path.read_text() for path in sorted(self.tmp_path.glob("worker*.log"))]

    def wait_started(self, timeout: float = 60) -> None:
        wait_until(
            lambda: sum("started" in log for log in self.logs()) == len(self.processes),
            self.logs,
            timeout=timeout,
        )

    def stop_all(self) -> None:
        stop_all(self.processes, timeout=15)


WorkersFor = Callable[[str], tuple[Workers, App]]


@pytest.fixture
def workers_for(
    database_url: str, db_engine: sa.Engine, tmp_path: Path, stub: StubServer
) -> Iterator[WorkersFor]:
    started: list[Workers] = []

    def make(config_text: str) -> tuple[Workers, App]:
        path = tmp_path / "config.yaml"
        path.write_text(config_text.replace("{stub}", stub.url("")))
        app = App(config=load_config([path]), db=db_engine)
        workers = Workers(database_url, path, tmp_path)
        started.append(workers)
        return workers, app

    yield make
    for workers in started:
        workers.stop_all()
