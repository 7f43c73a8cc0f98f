"""Fixtures for the worker tests: a stub HTTP server and an App built from YAML."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.worker import Worker
from tests.stub_server import StubServer, running_stub

MakeApp = Callable[..., App]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from running_stub()


class FakeClock:
    """An injectable clock that only moves when told to."""

    def __init__(self, start: datetime.datetime) -> None:
        self.current = start

    def __call__(self) -> datetime.datetime:
        return self.current

    def advance(self, **delta: float) -> None:
        self.current += datetime.timedelta(**delta)


@pytest.fixture
def make_app(tmp_path: Path, db_engine: sa.Engine, stub: StubServer) -> Iterator[MakeApp]:
    """``make_app(yaml, **settings)``: ``{stub}`` in the YAML becomes the stub server's URL."""
    apps: list[App] = []

    def make(yaml_text: str, *, clock: Any = None, **settings: Any) -> App:
        path = tmp_path / f"config{len(apps)}.yaml"
        path.write_text(yaml_text.replace("{stub}", stub.url("")))
        settings.setdefault("poll_interval", 0.2)
        settings.setdefault("worker_id", f"test-worker-{len(apps)}")
        app = App(config=load_config([path]), db=db_engine, settings=Settings(**settings))
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
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the worker did not stop"
