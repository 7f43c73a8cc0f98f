"""Subscription batches go through the receivers: the delivery log, the circuit, pausing, rate."""

from __future__ import annotations

import pytest

from routemaster.app import App
from routemaster.config.origins import receiver_for_url
from routemaster.db import deliveries
from routemaster.db import receivers as shared
from routemaster.db.deliveries import DeliveryFilter
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running
from tests.worker.test_worker_subscription_sender import (
    CONFIG,
    FAST,
    HOOK,
    create,
    delivered_labels,
    shown,
    subscribe,
)

RECEIVERS = """
receivers:
  - match: '127\\.0\\.0\\.1'
    circuit: {failures: 2, cooldown: 1s}
"""


def logged(app: App) -> list[deliveries.Delivery]:
    with app.db.connect() as conn:
        return deliveries.matching(conn, DeliveryFilter(kind="subscription"), limit=100)[::-1]


def receiver_row(app: App, stub: StubServer) -> shared.ReceiverRow:
    receiver = receiver_for_url(app.config, stub.url(HOOK))
    with app.db.connect() as conn:
        [row] = shared.some(conn, [receiver.id])
    return row


def circuit(app: App, stub: StubServer) -> str | None:
    """The receiver's circuit, once its row exists (the first send makes it)."""
    receiver = receiver_for_url(app.config, stub.url(HOOK))
    with app.db.connect() as conn:
        rows = shared.some(conn, [receiver.id])
    return rows[0].circuit if rows else None


def test_every_send_is_in_the_delivery_log(make_app: MakeApp, stub: StubServer) -> None:
    stub.script(HOOK, Reply(500, b"down for maintenance"), Reply(200))
    app = make_app(CONFIG, **FAST)
    subscribe(app, stub, max_events=10)
    create(app, "a")
    with running(app):
        wait_until(lambda: shown(app).last_success_at is not None, timeout=10)
    failed, delivered = logged(app)
    assert (failed.kind, failed.outcome, failed.status) == ("subscription", "failed", 500)
    assert failed.response_excerpt == "down for maintenance"
    assert (failed.attempt, failed.trigger) == (1, "scheduled")
    assert (delivered.outcome, delivered.status, delivered.attempt) == ("delivered", 200, 2)
    assert delivered.trigger == "retry"
    assert failed.receiver == delivered.receiver == receiver_row(app, stub).id
    assert failed.state_machine is None and failed.label is None


def test_an_open_circuit_holds_batches_until_a_probe_succeeds(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script(HOOK, Reply(503), Reply(503), Reply(200))
    app = make_app(CONFIG + RECEIVERS, **FAST)
    subscribe(app, stub, max_events=10)
    create(app, "a", "b")
    with running(app):
        wait_until(lambda: circuit(app, stub) == "open", timeout=10)
        opened = len(stub.received(HOOK))
        assert opened == 2
        wait_until(lambda: "waiting for the receiver" in (shown(app).last_error or ""), timeout=5)
        wait_until(lambda: shown(app).last_success_at is not None, timeout=10)
    probe = logged(app)[-1]
    assert (probe.trigger, probe.outcome) == ("probe", "delivered")
    assert receiver_row(app, stub).circuit == "closed"
    sent = stub.received(HOOK)
    assert sent[2].at - sent[1].at >= 0.9  # nothing during the cooldown
    assert len({r.headers["webhook-id"] for r in sent}) == 1  # the same batch throughout
    assert delivered_labels(stub)[-2:] == ["a", "b"]


def test_a_paused_receiver_holds_batches(make_app: MakeApp, stub: StubServer) -> None:
    app = make_app(CONFIG, **FAST)
    subscribe(app, stub)
    create(app, "a")
    with running(app):
        wait_until(lambda: len(stub.received(HOOK)) == 1, timeout=10)
        with app.db.begin() as conn:
            shared.set_receiver_paused(conn, receiver_row(app, stub).id, paused=True)
        create(app, "b")
        wait_until(lambda: "waiting for the receiver" in (shown(app).last_error or ""), timeout=10)
        assert len(stub.received(HOOK)) == 1
        with app.db.begin() as conn:
            shared.set_receiver_paused(conn, receiver_row(app, stub).id, paused=False)
        wait_until(lambda: len(stub.received(HOOK)) == 2, timeout=10)
    assert delivered_labels(stub) == ["a", "b"]


def test_max_in_flight_counts_the_sends_of_every_subscription(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script(HOOK, Reply(200, delay=0.1))
    app = make_app(CONFIG + "receivers:\n  - match: '127'\n    max_in_flight: 1\n", **FAST)
    for name in ("s1", "s2", "s3"):
        subscribe(app, stub, name, max_events=1)
    create(app, "a", "b")
    with running(app):
        wait_until(lambda: len(stub.received(HOOK)) == 6, timeout=20)
    assert stub.most_in_flight == 1  # three subscriptions, one call at a time


@pytest.mark.parametrize("rate", ["5/s"])
def test_a_rate_spaces_the_batches(make_app: MakeApp, stub: StubServer, rate: str) -> None:
    app = make_app(CONFIG + f"receivers:\n  - match: '127'\n    rate: '{rate}'\n", **FAST)
    subscribe(app, stub, max_events=1)
    create(app, *[f"l{i}" for i in range(6)])
    with running(app):
        wait_until(lambda: len(stub.received(HOOK)) == 6, timeout=20)
    sent = stub.received(HOOK)
    assert sent[-1].at - sent[0].at >= 0.9  # 6 calls at 5/s: at least a second apart, end to end
    assert delivered_labels(stub) == [f"l{i}" for i in range(6)]
