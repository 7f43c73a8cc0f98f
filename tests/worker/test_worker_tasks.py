"""The worker and pull actions: it never posts for them, and it ends leases that ran out."""

from __future__ import annotations

import datetime
import random

from routemaster import service
from routemaster.db import labels as label_store
from routemaster.service import tasks
from tests.stub_server import StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running

CONFIG = """
state_machines:
  jobs:
    retry: {max_attempts: 2, initial_delay: 1s, max_delay: 1s}
    states:
      - action: build
        worker: {lease: 2s}
        next: test
      - action: test
        webhook: "{stub}/test/<label>"
        next: done
      - gate: done
        exit_condition: false
"""

START = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)


def test_pull_actions_are_left_to_pull_workers_and_webhooks_still_go(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG)
    machine = app.config.get_machine("jobs")
    with running(app):
        service.create_label(app, machine, "a", {})
        states = tasks.pull_states(app.config)
        [task] = tasks.claim_tasks(app, states, worker="w", limit=5, rng=random.Random(1))
        assert stub.received() == []  # the worker never posts for a pull action
        tasks.complete(app, task.id, {"built": True})
        stub.wait_for(lambda: len(stub.received()) == 1, timeout=5)
        assert stub.received()[0].path == "/test/a"
        wait_until(
            lambda: service.get_label(app, machine, "a").state == "done",
            "the label done",
            timeout=5,
        )


def test_the_worker_counts_a_run_out_lease_as_a_failed_attempt(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    app = make_app(CONFIG, clock=clock)
    machine = app.config.get_machine("jobs")
    states = tasks.pull_states(app.config)
    service.create_label(app, machine, "a", {})
    rng = random.Random(1)
    with running(app) as worker:
        [first] = tasks.claim_tasks(app, states, worker="w", limit=1, rng=rng)
        clock.advance(seconds=3)
        wait_until(
            lambda: service.get_label(app, machine, "a").last_error is not None,
            "a failed attempt recorded",
            timeout=5,
        )
        label = service.get_label(app, machine, "a")
        assert "lease ran out" in (label.last_error or "")
        assert not label.errored
        clock.advance(seconds=1)
        [second] = tasks.claim_tasks(app, states, worker="w", limit=1, rng=rng)
        assert second.attempt == 2
        clock.advance(seconds=3)  # the last attempt runs out too: errored
        wait_until(
            lambda: service.get_label(app, machine, "a").errored, "the label errored", timeout=5
        )
        assert worker.in_flight == 0
    assert tasks.claim_tasks(app, states, worker="w", limit=1, rng=rng) == []
    assert first.id != second.id
    with app.db.connect() as conn:  # becoming errored is a history entry
        kinds = [entry.kind for entry in label_store.history(conn, machine.name, "a")]
    assert kinds == ["created", "errored"]
