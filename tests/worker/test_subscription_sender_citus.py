"""Push subscriptions on Citus: the sender reads through the confirmed horizon (SPEC D2, F1).

Runs only with ``ROUTEMASTER_TEST_CITUS_URL`` (tests/citus_cluster.py). The sender
runs alone (its thread and pool, as the worker starts it) against a real
receiver on 127.0.0.1, while transactions write to two workers at once, one
of them held half-committed: every event arrives once, in stream order.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.db import subscriptions as store
from routemaster.db import transitions
from routemaster.db.changes import START, Position
from routemaster.worker.subscription_sender import SubscriptionSender
from tests.citus_cluster import Cluster, second_worker_held
from tests.db.test_changes_citus import Reader
from tests.stub_server import StubServer
from tests.waiting import wait_until

CONFIG = """
subscriptions:
  allow: ['^http://127\\.0\\.0\\.1:']
state_machines:
  m:
    states:
      - gate: start
        exit_condition: false
"""

HOOK = "/events"


pytestmark = pytest.mark.citus


@pytest.fixture
def app(citus_cluster: Cluster, tmp_path: Path) -> App:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    settings = Settings(subscription_poll=0.01, subscription_backoff=0.05, poll_interval=0.2)
    return App(config=load_config([path]), db=citus_cluster.engine, settings=settings)


@pytest.fixture
def sender(app: App) -> Iterator[SubscriptionSender]:
    running = SubscriptionSender(app)
    running.start()
    yield running
    running.stop()


def _create(conn: sa.Connection, name: str) -> None:
    now = datetime.datetime.now(datetime.UTC)  # the sender cuts a batch by its events' age
    assert transitions.insert(conn, "m", name, {}, state="start", now=now) is not None


def _state(app: App, stub: StubServer) -> str:
    with app.db.connect() as conn:
        found = store.get_subscription(conn, "s")
        count = conn.exec_driver_sql("SELECT count(*) FROM history").scalar()
    return f"{found}, {count} changes, {len(_delivered(stub))} delivered, {app.horizon.rounds}"


def _delivered(stub: StubServer) -> list[tuple[Position, str]]:
    return [
        (Position.parse(event["id"]), event["label"])
        for request in stub.received(HOOK)
        for event in request.json()["events"]
    ]


def test_a_subscription_gets_every_change_once_in_order_across_two_phase_commits(
    citus_cluster: Cluster, app: App, stub: StubServer, sender: SubscriptionSender
) -> None:
    first, second = citus_cluster.workers[:2]
    ones = citus_cluster.names_on(first, "one", 12)
    twos = citus_cluster.names_on(second, "two", 12)
    with app.db.begin() as conn:
        store.put_subscription(
            conn,
            "s",
            store.SubscriptionSettings(stub.url(HOOK), None, 100, 0, None),
            after=START,
        )

    def pair(index: int) -> None:  # one transaction on both workers
        with app.db.begin() as conn:
            _create(conn, twos[index])
            _create(conn, ones[index])

    pairs = [threading.Thread(target=pair, args=(index,)) for index in range(10)]
    for thread in pairs:
        thread.start()
    for thread in pairs:
        thread.join()

    with app.db.connect() as writer:
        writer.begin()
        _create(writer, twos[10])
        _create(writer, ones[10])
        with second_worker_held(citus_cluster, writer, second) as moment:
            with app.db.begin() as conn:
                _create(conn, ones[11])
            wait_until(
                lambda: len(_delivered(stub)) >= 20,
                lambda: f"the first 20 events: {_state(app, stub)}",
                timeout=30,
            )
            # The sender keeps looking (its look and claims go on) but sends nothing of the
            # held transaction, nor anything after it.
            rounds = app.horizon.rounds.worker_rounds
            wait_until(lambda: app.horizon.rounds.worker_rounds >= rounds + 3, timeout=30)
            assert all(position < Position(moment.xact, 0) for position, _ in _delivered(stub))
            assert len(_delivered(stub)) == 20
    with app.db.begin() as conn:
        _create(conn, twos[11])

    wait_until(lambda: len(_delivered(stub)) >= 24, "every event", timeout=30)
    delivered = _delivered(stub)
    positions = [position for position, _ in delivered]
    assert positions == sorted(set(positions))  # once each, in stream order
    stream = Reader(app.db)
    stream.until(set(ones) | set(twos))
    assert [(change.position, change.label) for change in stream.changes] == delivered
    with app.db.connect() as conn:
        found = store.get_subscription(conn, "s")
    assert found is not None and found.acknowledged >= positions[-1]  # idle: moved on
