"""Push subscriptions sent by real workers to a real receiver on 127.0.0.1.

The receiver is allowed through ``subscriptions: allow``; the workers run
their real loop in threads (several at once where sharing matters).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import itertools
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.db import subscription_batches as sending
from routemaster.db import subscriptions as store
from routemaster.db import transitions
from routemaster.db.changes import Position, present
from routemaster.db.subscriptions import Subscription, SubscriptionSettings
from routemaster.service.batch_sending import BatchSender, ReceiverSeam
from routemaster.worker import Worker
from tests.stub_server import Recorded, Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, WorkersFor, running

CONFIG = """
subscriptions:
  allow: ['^http://127\\.0\\.0\\.1:']
state_machines:
  m:
    states:
      - gate: start
        exit_condition: false
  other:
    states:
      - gate: start
        exit_condition: false
"""

FAST = {
    "subscription_poll": 0.01,
    "subscription_backoff": 0.05,
    "subscription_max_backoff": 0.2,
}

HOOK = "/events"


@pytest.fixture
def app(make_app: MakeApp) -> App:
    return make_app(CONFIG, **FAST)


def subscribe(app: App, stub: StubServer, name: str = "s", **fields: Any) -> Subscription:
    settings = SubscriptionSettings(
        url=fields.pop("url", stub.url(HOOK)),
        state_machines=fields.pop("state_machines", None),
        max_events=fields.pop("max_events", 100),
        batch_delay_ms=fields.pop("batch_delay_ms", 0),
        signing_secret_env=fields.pop("signing_secret_env", None),
    )
    with app.db.begin() as conn:
        subscription, _ = store.put_subscription(conn, name, settings, after=fields.get("after"))
    return subscription


def create(app: App, *names: str, machine: str = "m") -> None:
    for name in names:
        service.create_label(app, app.config.get_machine(machine), name, {})


def shown(app: App, name: str = "s") -> Subscription:
    with app.db.connect() as conn:
        found = store.get_subscription(conn, name)
    assert found is not None
    return found


def lag(app: App, name: str = "s") -> store.Lag:
    """The subscription's lag now: counted below the stream's horizon, which a transaction of
    another database ending at the wrong moment can hold back for a read (so tests await it)."""
    with app.db.connect() as conn:
        return store.lag(conn, shown(app, name), app.horizon)


def events(requests: list[Recorded]) -> list[dict[str, Any]]:
    return [event for request in requests for event in request.json()["events"]]


def positions(found: list[dict[str, Any]]) -> list[Position]:
    return [Position.parse(event["id"]) for event in found]


def delivered_labels(stub: StubServer) -> list[str]:
    return [event["label"] for event in events(stub.received(HOOK))]


def test_batches_are_cut_at_max_events(app: App, stub: StubServer) -> None:
    subscribe(app, stub, max_events=5, batch_delay_ms=60_000)
    create(app, *[f"l{i:02}" for i in range(12)])
    with running(app):
        wait_until(lambda: len(stub.received(HOOK)) >= 2, timeout=10)
        wait_until(lambda: shown(app).last_success_at is not None, timeout=5)
    batches = stub.received(HOOK)
    assert [len(r.json()["events"]) for r in batches] == [5, 5]  # 2 wait for the delay
    assert delivered_labels(stub) == [f"l{i:02}" for i in range(10)]
    body = batches[0].json()
    assert body["subscription"] == "s"
    first = body["events"][0]
    assert set(first) == {
        "id",
        "state_machine",
        "label",
        "kind",
        "old_state",
        "new_state",
        "at",
        "forced",
        "reason",
        "version",
    }
    assert (first["state_machine"], first["kind"], first["new_state"]) == ("m", "created", "start")
    wait_until(lambda: lag(app).pending == 2, timeout=5)  # the horizon past both (see lag)


def test_batches_are_cut_when_the_oldest_event_is_batch_delay_old(
    app: App, stub: StubServer
) -> None:
    subscribe(app, stub, max_events=100, batch_delay_ms=400)
    with running(app):
        create(app, "a", "b", "c")
        wait_until(lambda: len(stub.received(HOOK)) == 1, timeout=10)
        arrived = stub.received(HOOK)[0]
    assert [e["label"] for e in arrived.json()["events"]] == ["a", "b", "c"]
    made = min(
        service.history(app, app.config.get_machine("m"), name)[0].created
        for name in ("a", "b", "c")
    )
    waited = arrived_at_wall(arrived) - made.timestamp()
    assert 0.35 <= waited < 8, waited  # the delay, and not much more (a loaded machine)


def arrived_at_wall(request: Recorded) -> float:
    """The wall-clock time the receiver got ``request`` (it records monotonic time)."""
    return time.time() - (time.monotonic() - request.at)


def test_order_and_completeness_across_concurrent_writers(app: App, stub: StubServer) -> None:
    subscribe(app, stub, max_events=7, batch_delay_ms=20)
    names = [[f"w{w}-{i:03}" for i in range(40)] for w in range(4)]
    with running(app):
        writers = [threading.Thread(target=create, args=(app, *batch)) for batch in names]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        wait_until(lambda: len(delivered_labels(stub)) >= 160, timeout=20)
    found = events(stub.received(HOOK))
    assert sorted(e["label"] for e in found) == sorted(n for batch in names for n in batch)
    assert positions(found) == sorted(set(positions(found)))  # stream order, no duplicate
    for batch in names:  # each writer's labels arrive in the order it made them
        mine = [e["label"] for e in found if e["label"] in batch]
        assert mine == batch


def test_a_transaction_that_commits_late_is_not_skipped(app: App, stub: StubServer) -> None:
    subscribe(app, stub, max_events=10)
    with running(app), app.db.connect() as slow:
        transaction = slow.begin()
        slow.execute(sa.text("SELECT pg_current_xact_id()"))  # takes its id now: before a, b
        looked_after = app.now()
        create(app, "a", "b")  # committed after it started, before it commits
        # the sender looked on the news, found nothing readable, and set itself to look again
        wait_until(
            lambda: shown(app).due_at > looked_after + datetime.timedelta(seconds=0.5), timeout=10
        )
        assert delivered_labels(stub) == []  # the stream waits for the open transaction
        transitions.insert(slow, "m", "late", {}, state="start", now=app.now(), due=False)
        transaction.commit()
        wait_until(lambda: len(delivered_labels(stub)) == 3, timeout=10)
    assert delivered_labels(stub) == ["late", "a", "b"]  # stream order: by transaction
    found = positions(events(stub.received(HOOK)))
    assert found == sorted(found)


def test_a_subscriber_that_is_down_gets_the_same_batch_again_then_everything(
    app: App, stub: StubServer
) -> None:
    stub.script(HOOK, Reply(503), Reply(503), Reply(500), Reply(200))
    subscribe(app, stub, max_events=3, batch_delay_ms=0)
    create(app, *[f"l{i}" for i in range(8)])
    with running(app):
        wait_until(lambda: shown(app).failures_in_a_row >= 2, timeout=10)
        failing = shown(app)
        assert failing.last_error is not None and "503" in failing.last_error
        assert failing.batch_id is not None
        wait_until(lambda: "l7" in delivered_labels(stub), timeout=10)
    sent = stub.received(HOOK)
    first_four = sent[:4]
    assert len({r.headers["webhook-id"] for r in first_four}) == 1  # one batch, sent 4 times
    assert len({r.body for r in first_four}) == 1  # identical events
    later = sent[3:]  # from the acknowledged one on: each batch once
    assert len({r.headers["webhook-id"] for r in later}) == len(later)
    assert [e["label"] for e in events(later)] == [f"l{i}" for i in range(8)]
    assert shown(app).failures_in_a_row == 0 and shown(app).last_error is None


def test_replay_from_a_cursor_sends_the_same_events_under_a_new_webhook_id(
    app: App, stub: StubServer
) -> None:
    start = subscribe(app, stub, max_events=10).acknowledged
    create(app, "a", "b", "c")
    with running(app):
        wait_until(lambda: len(delivered_labels(stub)) == 3, timeout=10)
        with app.db.begin() as conn:
            store.set_cursor(conn, "s", start)
        wait_until(lambda: len(delivered_labels(stub)) == 6, timeout=10)
    first, replay = stub.received(HOOK)
    assert first.json()["events"] == replay.json()["events"]
    assert first.headers["webhook-id"] != replay.headers["webhook-id"]


def test_a_subscription_can_start_after_a_given_position(app: App, stub: StubServer) -> None:
    create(app, "old")
    with app.db.connect() as conn:
        here = present(conn)
    create(app, "new")
    subscribe(app, stub, after=here)
    with running(app):
        wait_until(lambda: len(delivered_labels(stub)) >= 1, timeout=10)
    assert delivered_labels(stub) == ["new"]


def test_a_state_machine_filter(app: App, stub: StubServer) -> None:
    subscribe(app, stub, state_machines=("other",))
    create(app, "a")
    create(app, "b", machine="other")
    create(app, "c")
    create(app, "d", machine="other")
    with running(app):
        wait_until(lambda: len(delivered_labels(stub)) >= 2, timeout=10)
        create(app, "e")
        wait_until(
            lambda: shown(app).acknowledged > positions(events(stub.received(HOOK)))[-1], timeout=10
        )
    assert delivered_labels(stub) == ["b", "d"]


@contextmanager
def workers(make_app: MakeApp, count: int) -> Iterator[list[Worker]]:
    with ExitStack() as stack:
        yield [stack.enter_context(running(make_app(CONFIG, **FAST))) for _ in range(count)]


def test_workers_never_send_two_batches_of_one_subscription_at_once(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script(HOOK, Reply(200, delay=0.05))
    stub.script("/other", Reply(200, delay=0.05))
    app = make_app(CONFIG, **FAST)
    subscribe(app, stub, max_events=4, batch_delay_ms=0)
    subscribe(app, stub, "t", url=stub.url("/other"), max_events=4, batch_delay_ms=0)
    create(app, *[f"l{i:02}" for i in range(40)])
    with workers(make_app, 3):
        wait_until(lambda: len(delivered_labels(stub)) >= 40, timeout=20)
        wait_until(lambda: len(events(stub.received("/other"))) >= 40, timeout=20)
    for path in (HOOK, "/other"):
        sent = stub.received(path)
        found = events(sent)
        assert [e["label"] for e in found] == [f"l{i:02}" for i in range(40)]
        # each request came after the one before it was answered (0.05 s): never two at once
        arrivals = [request.at for request in sent]
        assert all(b - a >= 0.05 for a, b in itertools.pairwise(arrivals))


@pytest.mark.slow
def test_a_worker_killed_mid_batch_leaves_it_to_another(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    stub.script(HOOK, Reply(200, delay=30), Reply(200))
    group, app = workers_for(CONFIG)
    subscribe(app, stub, max_events=10)
    create(app, "a", "b")
    lease = {"subscription_lease": 2, "subscription_timeout": 60, "subscription_poll": 0.01}
    first = group.start(**lease)
    wait_until(lambda: stub.in_flight == 1, "the first worker never sent", timeout=20)
    first.send_signal(signal.SIGKILL)
    first.wait()
    group.start(**lease)
    wait_until(lambda: len(stub.received(HOOK)) == 2, "no other worker sent it again", timeout=20)
    wait_until(lambda: shown(app).last_success_at is not None, timeout=10)
    cut, again = stub.received(HOOK)
    assert cut.headers["webhook-id"] == again.headers["webhook-id"]
    assert cut.body == again.body
    assert again.at - cut.at >= 1.5  # not before the lease ran out
    assert shown(app).batch_id is None


def test_deleting_a_subscription_mid_flight(app: App, stub: StubServer) -> None:
    stub.script(HOOK, Reply(200, delay=1.0))
    subscribe(app, stub)
    create(app, "a")
    with running(app):
        wait_until(lambda: stub.in_flight == 1, timeout=10)
        with app.db.begin() as conn:
            assert store.delete_subscription(conn, "s")
        wait_until(lambda: stub.in_flight == 0, timeout=10)
        with transaction_open(app):  # as a worker's or a listener's may be, any time
            create(app, "b")
            subscribe(app, stub, "fresh")  # starts at the present: "b" is not for it
        create(app, "c")
        wait_until(lambda: len(stub.received(HOOK)) == 2, timeout=10)
    assert [r.json()["subscription"] for r in stub.received(HOOK)] == ["s", "fresh"]
    assert delivered_labels(stub) == ["a", "c"]


@contextmanager
def transaction_open(app: App) -> Iterator[None]:
    """Another transaction of the database, begun and given an id, open throughout the block."""
    with app.db.connect() as other, other.begin():
        other.execute(sa.text("SELECT pg_current_xact_id()"))
        yield


def test_a_subscription_made_while_another_transaction_is_open_starts_after_what_was_committed(
    app: App, stub: StubServer
) -> None:
    with transaction_open(app):
        create(app, "before")
        subscribe(app, stub)
        with app.db.connect() as conn:
            assert store.lag(conn, shown(app), app.horizon).pending == 0
    create(app, "after")
    with running(app):
        wait_until(lambda: len(stub.received(HOOK)) == 1, timeout=10)
    assert delivered_labels(stub) == ["after"]


def test_a_cursor_reset_supersedes_the_batch_in_flight(app: App, stub: StubServer) -> None:
    stub.script(HOOK, Reply(200, delay=1.0), Reply(200))
    start = subscribe(app, stub).acknowledged
    create(app, "a")
    with running(app):
        wait_until(lambda: stub.in_flight == 1, timeout=10)
        create(app, "b")
        with app.db.begin() as conn:
            store.set_cursor(conn, "s", start)
        wait_until(lambda: len(stub.received(HOOK)) == 2, timeout=10)
        wait_until(
            lambda: shown(app).batch_id is None and shown(app).last_success_at is not None,
            timeout=10,
        )
    first, second = stub.received(HOOK)
    assert [e["label"] for e in second.json()["events"]] == ["a", "b"]  # replayed from start
    assert first.headers["webhook-id"] != second.headers["webhook-id"]
    with app.db.connect() as conn:
        assert store.lag(conn, shown(app), app.horizon).pending == 0


def test_batches_are_signed_with_the_secret_read_when_sending(
    make_app: MakeApp, stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = base64.b64encode(b"k" * 24).decode()
    app = make_app(CONFIG, **FAST)
    subscribe(app, stub, signing_secret_env="ROUTEMASTER_SUBSCRIPTION_SECRET_TEST")
    monkeypatch.delenv("ROUTEMASTER_SUBSCRIPTION_SECRET_TEST", raising=False)
    create(app, "a")
    with running(app):
        wait_until(lambda: shown(app).last_error is not None, timeout=10)
        assert "ROUTEMASTER_SUBSCRIPTION_SECRET_TEST" in (shown(app).last_error or "")
        assert stub.received(HOOK) == []  # never sent unsigned
        monkeypatch.setenv("ROUTEMASTER_SUBSCRIPTION_SECRET_TEST", "whsec_" + key)
        with app.db.begin() as conn:  # look again now rather than after the re-check delay
            conn.execute(sa.text("UPDATE subscriptions SET due_at = now()"))
        wait_until(lambda: len(stub.received(HOOK)) == 1, timeout=10)
    request = stub.received(HOOK)[0]
    signed = f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
    digest = hmac.new(base64.b64decode(key), signed + request.body, hashlib.sha256).digest()
    assert request.headers["webhook-signature"] == "v1," + base64.b64encode(digest).decode()


def test_an_address_inside_the_network_is_refused_when_sending(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(
        CONFIG.replace("'^http://127\\.0\\.0\\.1:'", "'^https://example\\.com$'"), **FAST
    )
    subscribe(app, stub)  # stored directly: the API would have refused it
    create(app, "a")
    with running(app):
        wait_until(lambda: shown(app).failures_in_a_row >= 1, timeout=10)
    assert stub.received(HOOK) == []
    assert "inside the network" in (shown(app).last_error or "")


def test_a_stopping_worker_gives_a_claimed_subscription_back_unsent(
    app: App, stub: StubServer
) -> None:
    subscribe(app, stub)
    create(app, "a")
    now = app.now()
    with app.db.begin() as conn:  # claimed for an hour, as if just before SIGTERM
        [claimed] = sending.claim_subscriptions(
            conn,
            token="t",
            now=now,
            lease_until=now + datetime.timedelta(hours=1),
            news=True,
            limit=1,
        )
    stopping = threading.Event()
    stopping.set()
    with requests.Session() as session:
        sender = BatchSender(
            app, session, rng=random.Random(), environ={}, seam=ReceiverSeam(), stopping=stopping
        )
        sender.handle(claimed)
    assert stub.received() == []
    given_back = shown(app)
    assert given_back.lease_token is None
    assert given_back.due_at <= app.now()
    with running(app):  # so a running worker sends it at once, not after the hour's lease
        wait_until(lambda: delivered_labels(stub) == ["a"], timeout=5)
