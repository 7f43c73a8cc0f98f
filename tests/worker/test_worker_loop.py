"""The loop's promises: hanging receivers hold only their own slots, idle means idle,
and a slow delivery is never sent twice while it is still in flight."""

from __future__ import annotations

import datetime
import logging
import os
import time

import pytest
import sqlalchemy as sa

from routemaster.worker.loop import OutageLog
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, WorkersFor, running
from tests.worker.notify import create, notify_config, state

CONFIG = notify_config(retry="max_attempts: 3, initial_delay: 1s, timeout: 30s")


def test_a_hanging_receiver_does_not_hold_up_healthy_deliveries(
    make_app: MakeApp, stub: StubServer
) -> None:
    """Three of four slots hang; every healthy label still goes out through the fourth."""
    hanging = [f"hang{i}" for i in range(3)]
    for name in hanging:
        stub.script(f"/hook/{name}", Reply(200, delay=15))
    app = make_app(CONFIG, delivery_concurrency=4)
    with running(app):
        create(app, *hanging)
        stub.wait_for(lambda: stub.in_flight == 3)
        healthy = [f"ok{i}" for i in range(20)]
        for name in healthy:
            create(app, name)
        stub.wait_for(lambda: all(stub.received(f"/hook/{name}") for name in healthy))
        # All of them went out while the hanging receivers still held their slots.
        assert stub.in_flight == 3
        wait_until(lambda: all(state(app, name) == "done" for name in healthy), "healthy done")
        assert {state(app, name) for name in hanging} == {"notify"}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    user, system = int(fields[11]), int(fields[12])  # utime and stime, in clock ticks
    return (user + system) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_an_idle_worker_with_a_delivery_in_flight_uses_next_to_no_cpu(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    """Measured on the real process: it sleeps while a receiver takes its time."""
    stub.script("/hook/slow", Reply(200, delay=20))
    workers, app = workers_for(CONFIG)
    process = workers.start(delivery_concurrency=16)
    workers.wait_started()
    create(app, "slow")
    stub.wait_for(lambda: stub.in_flight == 1)
    before, started = _cpu_seconds(process.pid), time.monotonic()
    time.sleep(4)  # a measurement window, not a wait for behaviour
    used = _cpu_seconds(process.pid) - before
    window = time.monotonic() - started
    assert used / window < 0.05, f"{used:.2f} s of CPU in {window:.1f} s"
    assert stub.in_flight == 1 and len(stub.received("/hook/slow")) == 1


def test_a_slow_delivery_is_not_sent_again_while_in_flight_past_the_lease(
    make_app: MakeApp, stub: StubServer
) -> None:
    """Two workers, a 3 s lease, a receiver taking 8 s: the lease is renewed, one request."""
    stub.script("/hook/slow", Reply(200, delay=8))
    first = make_app(CONFIG, lease=datetime.timedelta(seconds=3), worker_id="first")
    second = make_app(CONFIG, lease=datetime.timedelta(seconds=3), worker_id="second")
    with running(first):
        create(first, "slow")
        stub.wait_for(lambda: stub.in_flight == 1)
        with running(second):
            wait_until(lambda: state(first, "slow") == "done", "delivered once", timeout=20)
    assert len(stub.received("/hook/slow")) == 1


def test_a_database_outage_is_one_line_per_change_and_a_reminder_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    outage = OutageLog(clock=lambda: now[0])
    refused = sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused\nDETAIL: x"))
    with caplog.at_level(logging.INFO, logger="routemaster.worker.loop"):
        for _ in range(130):  # the loop's polls for two minutes and ten seconds
            outage.down(refused)
            now[0] += 1
        outage.up()
        outage.up()
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("ERROR", f"database unavailable; the worker waits for it: {str(refused).splitlines()[0]}"),
        ("ERROR", f"database still unavailable after 60 s: {str(refused).splitlines()[0]}"),
        ("ERROR", f"database still unavailable after 120 s: {str(refused).splitlines()[0]}"),
        ("INFO", "database available again after 130 s"),
    ]
