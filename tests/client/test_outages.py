"""The client through a database outage of the service (503s) and a restart of the service
(connections refused): every task handled once, none lost."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import requests
import sqlalchemy as sa

from routemaster.client import Task, Worker
from tests.api.tcp_proxy import TcpProxy
from tests.client.support import (
    Recorder,
    create,
    done,
    leased,
    machine_file,
    recording_worker,
    running,
)
from tests.serving import free_port, serve_process, serving
from tests.waiting import wait_until

NAMES = [f"job-{n}" for n in range(40)]


def held_back(worker: Worker) -> bool:
    """Whether a finished task's outcome waits for the service (queued, or being retried)."""
    book = worker._book
    with book.lock:
        return any(held.state in ("finished", "sending") for held in book.held.values())


def root_status(base: str) -> int:
    try:
        return requests.get(base + "/", timeout=5).status_code
    except requests.RequestException:
        return 0


def test_the_client_rides_out_a_database_outage_of_the_service(
    tmp_path: Path, database_url: str, db_engine: sa.Engine
) -> None:
    url = sa.engine.make_url(database_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    recorder = Recorder()
    try:
        with serving(
            machine_file(tmp_path),
            proxied,
            env={"ROUTEMASTER_DIRECT_DATABASE_URL": proxied},
        ) as base:
            worker = recording_worker(base, recorder, name="outage")
            with running(worker):
                create(base, NAMES)
                wait_until(lambda: len(recorder.finished) >= 8, "some tasks handled")
                proxy.stop()  # the database is gone: the service answers 503
                wait_until(lambda: root_status(base) == 503, "the service saying 503")
                # a result finished during the outage waits to be sent
                wait_until(lambda: held_back(worker), "a result held back by the outage")
                proxy.start()
                wait_until(
                    lambda: done(base, NAMES) == len(NAMES),
                    "every label done after the outage",
                    timeout=60,
                )
            assert leased(base, NAMES) == []
    finally:
        proxy.stop()
    assert recorder.per_label() == {name: 1 for name in NAMES}
    assert {task.attempt for task in recorder.calls} == {1}  # no lease ran out


def test_the_client_rides_out_a_restart_of_the_service(
    tmp_path: Path, database_url: str, db_engine: sa.Engine
) -> None:
    config = machine_file(tmp_path, lease="45s")  # longer than the restart takes
    port = free_port()
    recorder = Recorder()
    restarted = threading.Event()
    worker = Worker(
        f"http://127.0.0.1:{port}", state_machine="jobs", state="work", concurrency=4, wait=2
    )

    @worker.task
    def handle(task: Task) -> dict[str, Any]:
        recorder.started(task)
        if len(recorder.finished) >= 8:
            restarted.wait(120)  # these four hold their tasks across the restart
        recorder.done(task)
        return {"handled": True}

    with contextlib.ExitStack() as servers:  # the second serve outlives the worker's drain
        with running(worker):
            with serve_process(config, database_url, port=port) as (_, base):
                create(base, NAMES)
                wait_until(lambda: len(recorder.calls) >= 12, "four handlers held up")
            # that serve is stopped (SIGTERM): connections are refused until the next answers
            assert root_status(base) == 0
            _, again = servers.enter_context(serve_process(config, database_url, port=port))
            restarted.set()
            wait_until(
                lambda: done(again, NAMES) == len(NAMES),
                "every label done after the restart",
                timeout=120,
            )
        assert leased(again, NAMES) == []
    assert recorder.per_label() == {name: 1 for name in NAMES}
