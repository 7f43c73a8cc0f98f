"""Receivers: the circuit, Retry-After, pausing, and one receiver never holding up another."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from routemaster import service
from routemaster.app import App
from tests.stub_server import Reply, StubServer, running_stub
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running
from tests.worker.notify import create, notify_config
from tests.worker.test_delivery_log import client_of

CONFIG = notify_config(
    retry="max_attempts: 3, initial_delay: 1s, max_delay: 2s",
    receiver="circuit: {failures: 3, cooldown: 1s, give_up_after: 1h}",
)


@pytest.fixture
def other_stub() -> Iterator[StubServer]:
    yield from running_stub()


def label(app: App, name: str) -> service.Label:
    return service.get_label(app, app.config.get_machine("m"), name)


def receiver(client: FlaskClient, ident: str | None = None) -> dict[str, Any]:
    found: list[dict[str, Any]] = client.get("/receivers").get_json()["receivers"]
    return found[0] if ident is None else next(r for r in found if r["id"] == ident)


def receiver_id(stub: StubServer) -> str:
    return "http-127.0.0.1-" + stub.url("").rsplit(":", 1)[1]


def deliveries(client: FlaskClient, **query: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get(
        "/deliveries", query_string={"limit": "1000", **query}
    ).get_json()["deliveries"]
    return found


def test_the_circuit_opens_probes_without_attempts_and_closes(
    make_app: MakeApp, stub: StubServer
) -> None:
    names = [f"l{i}" for i in range(8)]
    for name in names:
        stub.script(f"/hook/{name}", Reply(503))
    app = make_app(CONFIG, delivery_concurrency=1)
    client = client_of(app)
    with running(app):
        create(app, *names)
        wait_until(lambda: receiver(client)["state"] in ("open", "half_open"), "opened", timeout=10)
        opened = {name: label(app, name).attempts for name in names}
        assert sum(opened.values()) == 3  # the three failures that opened it, one attempt each
        wait_until(
            lambda: len(deliveries(client, outcome="failed")) >= 6, "3 failed probes", timeout=10
        )
        probes = [entry for entry in deliveries(client) if entry["trigger"] == "probe"]
        assert len(probes) >= 2
        assert {name: label(app, name).attempts for name in names} == opened  # none used
        assert not any(label(app, name).errored for name in names)
        for name in names:
            stub.script(f"/hook/{name}", Reply(200))
        wait_until(
            lambda: all(label(app, name).state == "done" for name in names), "drained", timeout=15
        )
    assert receiver(client)["state"] == "closed"
    assert receiver(client)["failures_in_a_row"] == 0
    delivered = [entry["label"] for entry in deliveries(client, outcome="delivered")]
    assert sorted(delivered) == sorted(names)  # each delivered once


def test_retry_after_holds_back_every_call_to_the_receiver(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/hook/a", Reply(429, headers=(("Retry-After", "2"),)), Reply(200))
    stub.script("/hook/b", Reply(200))
    app = make_app(CONFIG, delivery_concurrency=1)
    client = client_of(app)
    with running(app):
        create(app, "a")
        stub.wait_for(lambda: len(stub.received()) == 1)
        create(app, "b")
        wait_until(
            lambda: label(app, "a").state == label(app, "b").state == "done", "both", timeout=10
        )
    first, *rest = stub.received()
    assert first.path == "/hook/a"
    assert min(request.at for request in rest) - first.at >= 1.9  # b waited too
    assert deliveries(client, outcome="throttled")[0]["label"] == "a"


def test_a_paused_receiver_waits_while_others_are_called(
    make_app: MakeApp, stub: StubServer, other_stub: StubServer
) -> None:
    config = CONFIG.replace(
        "      - gate: done",
        '      - action: elsewhere\n        webhook: "' + other_stub.url("/x/<label>") + '"\n'
        "        next: done\n      - gate: done",
    ).replace("next: done\n      - action: elsewhere", "next: elsewhere\n      - action: elsewhere")
    app = make_app(config)
    client = client_of(app)
    paused_id, other = receiver_id(stub), receiver_id(other_stub)
    assert client.post(f"/receivers/{paused_id}/pause").get_json()["state"] == "paused"
    assert client.post(f"/receivers/{other}/pause").status_code == 200
    assert client.post(f"/receivers/{other}/resume").get_json()["state"] == "closed"
    with running(app):
        create(app, "a", "b")
        wait_until(lambda: receiver(client, paused_id)["waiting"] == 2, "both wait", timeout=10)
        assert stub.received() == []
        assert client.post(f"/receivers/{paused_id}/resume").status_code == 200
        wait_until(lambda: len(other_stub.received()) == 2, "delivered, then on", timeout=10)
    assert [label(app, n).attempts for n in ("a", "b")] == [0, 0]  # moved on after 1 each
    assert client.post("/receivers/nobody/pause").status_code == 404


def test_a_slow_receiver_does_not_hold_up_another(
    make_app: MakeApp, stub: StubServer, other_stub: StubServer
) -> None:
    config = f"""
state_machines:
  slow:
    states:
      - action: a
        webhook: "{{stub}}/slow/<label>"
        next: done
      - gate: done
        exit_condition: false
  fast:
    states:
      - action: a
        webhook: "{other_stub.url("/fast/<label>")}"
        next: done
      - gate: done
        exit_condition: false
"""
    stub.script("/slow/s0", Reply(200, delay=3))
    for i in range(1, 10):
        stub.script(f"/slow/s{i}", Reply(200, delay=3))
    app = make_app(config, delivery_concurrency=4)
    with running(app):
        for i in range(10):
            service.create_label(app, app.config.get_machine("slow"), f"s{i}", {})
        stub.wait_for(lambda: len(stub.received()) == 2)  # its share: half the slots
        for i in range(5):
            service.create_label(app, app.config.get_machine("fast"), f"f{i}", {})
        other_stub.wait_for(lambda: len(other_stub.received()) == 5, timeout=10)
        # all answered while the two slow calls are still under way, not after them
        assert stub.in_flight == 2 and len(stub.received()) == 2


def test_retry_errored_requeues_labels_errored_in_the_window(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/hook/a", Reply(410), Reply(200))
    stub.script("/hook/b", Reply(410), Reply(200))
    app = make_app(CONFIG)
    client = client_of(app)
    ident = receiver(client)["id"]
    before = datetime.datetime.now(datetime.UTC).isoformat()
    with running(app):
        create(app, "a", "b")
        wait_until(
            lambda: label(app, "a").errored and label(app, "b").errored, "errored", timeout=10
        )
        since_errored = datetime.datetime.now(datetime.UTC).isoformat()
        service.update_metadata(app, app.config.get_machine("m"), "a", {"note": 1})  # not an error
        outside = client.post(f"/receivers/{ident}/retry-errored", json={"since": since_errored})
        assert outside.get_json() == {"count": 0}
        assert client.post(f"/receivers/{ident}/retry-errored", json={}).status_code == 400
        for until in ("", "garbage", 5):  # never read as "no bound": refused, nothing retried
            unbounded = client.post(
                f"/receivers/{ident}/retry-errored", json={"since": before, "until": until}
            )
            assert unbounded.status_code == 400, until
            assert unbounded.get_json()["message"].startswith('"until" must be'), until
        retried = client.post(f"/receivers/{ident}/retry-errored", json={"since": before})
        assert retried.get_json() == {"count": 2}
        wait_until(
            lambda: label(app, "a").state == label(app, "b").state == "done", "done", timeout=10
        )
    history = client.get("/state-machines/m/labels/a/history").get_json()["history"]
    assert [entry["kind"] for entry in history] == ["created", "errored", "forced", "moved"]
    errored = history[1]
    assert (errored["old_state"], errored["new_state"], errored["forced"]) == (
        "notify",
        "notify",
        False,
    )
    assert "returned status 410" in errored["reason"]


def test_becoming_errored_is_a_change_on_the_stream(make_app: MakeApp, stub: StubServer) -> None:
    from routemaster.db.changes import START, read_changes

    stub.script("/hook/a", Reply(410))
    app = make_app(CONFIG)
    with running(app):
        create(app, "a")
        wait_until(lambda: label(app, "a").errored, "errored", timeout=10)
    with app.db.connect() as conn:
        changes = read_changes(conn, START, machine="m", limit=10, horizon=app.horizon).changes
    assert [change.kind for change in changes] == ["created", "errored"]
    assert changes[1].reason is not None and "410" in changes[1].reason


def test_labels_waiting_on_an_open_circuit_too_long_are_errored(make_app: MakeApp) -> None:
    from routemaster.db import receivers
    from routemaster.service.delivery_claims import Gatekeeper
    from routemaster.service.upkeep import give_up_on_open_receivers

    clock = FakeClock(datetime.datetime(2026, 11, 24, 12, tzinfo=datetime.UTC))
    app = make_app(CONFIG.replace("give_up_after: 1h", "give_up_after: 10m"), clock=clock)
    gate = Gatekeeper(app, 4)
    [(ident, known)] = [(i, r) for i, r in gate.receivers.items()]
    with app.db.begin() as conn:
        receivers.ensure(conn, [(ident, known.origin)])
        receivers.failed(
            conn,
            receivers.Failure(
                ident, clock(), "down", True, True, 1, clock() + datetime.timedelta(hours=1), None
            ),
        )
    create(app, "early")
    clock.advance(minutes=5)
    create(app, "late")
    clock.advance(minutes=6)
    assert give_up_on_open_receivers(app, gate.receivers) == 1
    assert label(app, "early").errored and "give_up_after" in (label(app, "early").last_error or "")
    assert not label(app, "late").errored
