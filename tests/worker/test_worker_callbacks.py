"""The callback pattern: with ``async_timeout``, a 202 makes the delivery a task finished later."""

from __future__ import annotations

import datetime

import pytest

from routemaster import service
from routemaster.app import App
from routemaster.db import deliveries
from routemaster.db import labels as label_store
from routemaster.service import tasks
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running

CONFIG = """
state_machines:
  jobs:
    retry: {max_attempts: 2, initial_delay: 1s, max_delay: 1s}
    states:
      - action: render
        webhook: "{stub}/render/<label>"
        async_timeout: 10s
        next: done
      - gate: done
        exit_condition: false
  plain:
    states:
      - action: notify
        webhook: "{stub}/plain/<label>"
        next: done
      - gate: done
        exit_condition: false
"""

START = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)


def waiting_until(clock: FakeClock) -> datetime.datetime:
    """When a label answered 202 now stops waiting for its callback (async_timeout: 10s)."""
    return clock() + datetime.timedelta(seconds=10)


def state(app: App, machine: str, name: str) -> service.Label:
    return service.get_label(app, app.config.get_machine(machine), name)


def test_a_202_leaves_the_label_waiting_until_the_receiver_completes_the_task(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG)
    stub.script("/render/a", Reply(202))
    with running(app):
        service.create_label(app, app.config.get_machine("jobs"), "a", {})
        stub.wait_for(lambda: len(stub.received("/render/a")) == 1, timeout=5)
        task_id = stub.received("/render/a")[0].headers["Routemaster-Task"]
        wait_until(
            lambda: state(app, "jobs", "a").due_at is not None,
            "the label held for its callback",
            timeout=5,
        )
        assert state(app, "jobs", "a").state == "render"
        completed = tasks.complete(app, task_id, {"rendered": True})
        assert completed.state == "done"
        assert completed.metadata == {"rendered": True}
    assert len(stub.received("/render/a")) == 1
    with pytest.raises(tasks.LeaseLost):
        tasks.complete(app, task_id, {})
    with app.db.connect() as conn:  # the delivery log: a 202 that became a task is "accepted"
        [call] = deliveries.of_label(conn, "jobs", "a", limit=10)
    assert (call.kind, call.status, call.outcome) == ("webhook", 202, "accepted")


def test_without_async_timeout_a_202_moves_the_label_on_as_in_1x(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG)
    stub.script("/plain/a", Reply(202))
    with running(app):
        service.create_label(app, app.config.get_machine("plain"), "a", {})
        wait_until(
            lambda: state(app, "plain", "a").state == "done",
            "the label moved on by the 202",
            timeout=5,
        )
    [request] = stub.received("/plain/a")
    assert "Routemaster-Task" not in request.headers


def test_a_completion_that_arrives_before_the_202_counts(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG)
    stub.script("/render/a", Reply(202, delay=1.0))
    with running(app):
        service.create_label(app, app.config.get_machine("jobs"), "a", {})
        stub.wait_for(lambda: len(stub.received("/render/a")) == 1, timeout=5)
        task_id = stub.received("/render/a")[0].headers["Routemaster-Task"]
        assert tasks.complete(app, task_id, {"early": True}).state == "done"
        wait_until(lambda: stub.in_flight == 0, "the webhook answered", timeout=5)
    label = state(app, "jobs", "a")
    assert (label.state, label.metadata) == ("done", {"early": True})
    assert len(stub.received("/render/a")) == 1


def test_a_callback_that_never_comes_is_retried_then_errored(
    make_app: MakeApp, stub: StubServer
) -> None:
    clock = FakeClock(START)
    app = make_app(CONFIG, clock=clock)
    stub.script("/render/a", Reply(202))
    with running(app):
        service.create_label(app, app.config.get_machine("jobs"), "a", {})
        stub.wait_for(lambda: len(stub.received("/render/a")) == 1, timeout=5)
        wait_until(
            lambda: state(app, "jobs", "a").due_at == waiting_until(clock),
            "the label held until the async timeout",
            timeout=5,
        )
        first = stub.received("/render/a")[0].headers["Routemaster-Task"]
        clock.advance(seconds=11)
        stub.wait_for(lambda: len(stub.received("/render/a")) == 2, timeout=5)
        second = stub.received("/render/a")[1].headers["Routemaster-Task"]
        assert second != first
        with pytest.raises(tasks.LeaseLost):
            tasks.heartbeat(app, first)
        wait_until(
            lambda: state(app, "jobs", "a").due_at == waiting_until(clock),
            "the label held until the async timeout",
            timeout=5,
        )
        clock.advance(seconds=11)
        wait_until(lambda: state(app, "jobs", "a").errored, "the label errored", timeout=5)
    assert len(stub.received("/render/a")) == 2
    assert "no callback" in (state(app, "jobs", "a").last_error or "")
    with app.db.connect() as conn:  # becoming errored is a history entry, as for any webhook
        kinds = [entry.kind for entry in label_store.history(conn, "jobs", "a")]
    assert kinds == ["created", "errored"]
