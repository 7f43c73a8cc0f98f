"""Real worker processes sharing one database: no duplicates, nothing lost."""

from __future__ import annotations

import datetime
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App, utc_now
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import WorkersFor
from tests.worker.notify import notify_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).with_name("launch_worker.py")

CONFIG = notify_config(retry="max_attempts: 5, initial_delay: 1s")


def count(app: App, sql: str) -> int:
    with app.db.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def test_three_workers_deliver_a_thousand_labels_once_each(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    workers, app = workers_for(CONFIG)
    machine = app.config.get_machine("m")
    for index in range(1000):
        stub.script(f"/hook/l{index}", Reply(200, delay=0.01))
    for _ in range(3):
        workers.start(delivery_concurrency=8)
    workers.wait_started()
    for index in range(1000):
        service.create_label(app, machine, f"l{index}", {"i": index})
    wait_until(
        lambda: count(app, "SELECT count(*) FROM labels WHERE state = 'done'") == 1000,
        "every label delivered",
        timeout=60,
    )
    paths = [request.path for request in stub.received()]
    assert sorted(paths) == sorted(f"/hook/l{index}" for index in range(1000))  # once each
    transitions = count(
        app,
        "SELECT count(*) FROM (SELECT label, old_state, new_state FROM history"
        " GROUP BY label, old_state, new_state HAVING count(*) > 1) AS duplicated",
    )
    assert transitions == 0
    assert count(app, "SELECT count(*) FROM history WHERE new_state = 'done'") == 1000
    delivered_by = [log.count("delivered ") for log in workers.logs()]
    assert all(delivered_by), f"every worker took a share: {delivered_by}"


def test_sigkill_mid_delivery_loses_nothing(workers_for: WorkersFor, stub: StubServer) -> None:
    workers, app = workers_for(CONFIG)
    stub.script("/hook/x", Reply(200, delay=30), Reply(200))
    first = workers.start(lease=2)
    workers.wait_started()
    service.create_label(app, app.config.get_machine("m"), "x", {})
    stub.wait_for(lambda: len(stub.received()) == 1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    workers.start(lease=2)
    stub.wait_for(lambda: len(stub.received()) == 2, timeout=15)
    wait_until(lambda: service.get_label(app, app.config.get_machine("m"), "x").state == "done")
    tokens = {request.headers["X-Idempotency-Token"] for request in stub.received()}
    assert len(tokens) == 1
    entries = service.history(app, app.config.get_machine("m"), "x")
    assert [(e.old_state, e.new_state) for e in entries] == [(None, "notify"), ("notify", "done")]
    assert str(entries[0].id) in tokens


def test_sigterm_finishes_in_flight_delivery_and_exits(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    workers, app = workers_for(CONFIG)
    stub.script("/hook/x", Reply(200, delay=1.5))
    process = workers.start()
    workers.wait_started()
    service.create_label(app, app.config.get_machine("m"), "x", {})
    stub.wait_for(lambda: len(stub.received()) == 1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=15) == 0
    label = service.get_label(app, app.config.get_machine("m"), "x")
    assert label.state == "done"
    assert len(stub.received()) == 1


def test_a_daily_time_fires_once_across_three_workers(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    config = """
state_machines:
  m:
    states:
      - gate: waiting
        triggers: [{time: 18h30m, timezone: Europe/London}]
        exit_condition: true
        next: notify
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: waiting
"""
    workers, app = workers_for(config)
    machine = app.config.get_machine("m")
    london_half_six = datetime.datetime(2031, 3, 3, 18, 30, tzinfo=datetime.UTC)  # GMT in March
    offset = (london_half_six - datetime.timedelta(seconds=4) - utc_now()).total_seconds()
    # The labels enter on the workers' clock: each is due at the next 18:30 after it entered.
    app.clock = lambda: utc_now() + datetime.timedelta(seconds=offset)
    for index in range(50):
        service.create_label(app, machine, f"l{index}", {})
    for _ in range(3):
        workers.start(clock_offset=offset)
    workers.wait_started()
    stub.wait_for(lambda: len(stub.received()) == 50, timeout=20)
    wait_until(
        lambda: count(app, "SELECT count(*) FROM history WHERE new_state = 'waiting'") == 100,
        timeout=10,
    )
    # Every worker has computed the occurrence: one recorded it, the others found it recorded.
    workers_passed = "already handled by another worker: 2031-03-03T18:30:00+00:00"
    wait_until(lambda: sum(log.count(workers_passed) for log in workers.logs()) == 2, workers.logs)
    assert sorted(r.path for r in stub.received()) == sorted(f"/hook/l{i}" for i in range(50))
    fired = sum(log.count("fired for 2031-03-03T18:30:00+00:00") for log in workers.logs())
    assert fired == 1
