"""Action webhooks delivered by a real worker loop (in a thread) to a real stub server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import time

import pytest

from routemaster import service
from routemaster.app import App
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running, wait_asleep

CONFIG = """
state_machines:
  m:
    retry: {max_attempts: 3, initial_delay: 1s, multiplier: 2}
    states:
      - gate: start
        triggers: [{metadata: n}]
        exit_condition: metadata.n is defined
        next: notify
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: done
      - gate: done
        triggers: [{metadata: again}]
        exit_condition: metadata.again = true
        next: start
"""


def enter_action(app: App, name: str) -> None:
    machine = app.config.get_machine("m")
    service.create_label(app, machine, name, {})
    service.update_metadata(app, machine, name, {"n": 1})


def state_of(app: App, name: str) -> service.Label:
    return service.get_label(app, app.config.get_machine("m"), name)


def wait_for_state(app: App, name: str, state: str, timeout: float = 10) -> service.Label:
    def reached() -> service.Label | None:
        label = state_of(app, name)
        return label if label.state == state else None

    return wait_until(reached, lambda: f"{name} in {state}: {state_of(app, name)}", timeout=timeout)


def wait_errored(app: App, name: str, timeout: float = 5) -> service.Label:
    def errored() -> service.Label | None:
        label = state_of(app, name)
        return label if label.errored else None

    return wait_until(errored, lambda: f"{name} errored: {state_of(app, name)}", timeout=timeout)


def notify_entries(app: App, name: str) -> list[int]:
    entries = service.history(app, app.config.get_machine("m"), name)
    return [entry.id for entry in entries if entry.new_state == "notify"]


def test_delivered_promptly_with_the_entry_as_idempotency_token(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG, poll_interval=5.0)
    with running(app) as worker:
        wait_asleep(worker)
        started = time.monotonic()
        enter_action(app, "a/b")
        stub.wait_for(lambda: len(stub.received()) == 1, timeout=5)
        latency = stub.received()[0].at - started
        label = wait_for_state(app, "a/b", "done")
    assert latency < 0.5, "woken by NOTIFY, not by polling"
    [request] = stub.received()
    assert request.path == "/hook/a%2Fb"
    assert request.json() == {"label": "a/b", "metadata": {"n": 1}}
    assert request.headers["X-Idempotency-Token"] == str(notify_entries(app, "a/b")[0])
    assert label.due_at is None
    assert [e.new_state for e in service.history(app, app.config.get_machine("m"), "a/b")] == [
        "start",
        "notify",
        "done",
    ]


def test_retries_with_backoff_and_the_same_token(make_app: MakeApp, stub: StubServer) -> None:
    stub.script("/hook/x", Reply(500), Reply(503), Reply(200))
    app = make_app(CONFIG)
    with running(app):
        enter_action(app, "x")
        label = wait_for_state(app, "x", "done", timeout=15)
    requests = stub.received("/hook/x")
    assert len(requests) == 3
    assert {r.headers["X-Idempotency-Token"] for r in requests} == {
        str(notify_entries(app, "x")[0])
    }
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(requests)]
    assert 0.5 <= gaps[0] <= 1.5  # attempt 1 failed: 1s with equal jitter
    assert 1.0 <= gaps[1] <= 2.5  # attempt 2 failed: 2s with equal jitter
    assert label.last_error is None and not label.errored


def test_a_later_entry_gets_a_new_token(make_app: MakeApp, stub: StubServer) -> None:
    app = make_app(CONFIG)
    machine = app.config.get_machine("m")
    with running(app):
        enter_action(app, "x")
        wait_for_state(app, "x", "done")
        service.update_metadata(app, machine, "x", {"again": True})
        service.update_metadata(app, machine, "x", {"n": 2, "again": False})
        stub.wait_for(lambda: len(stub.received()) == 2)
        wait_for_state(app, "x", "done")
    tokens = [r.headers["X-Idempotency-Token"] for r in stub.received()]
    assert tokens == [str(entry) for entry in notify_entries(app, "x")]
    assert tokens[0] != tokens[1]


def test_errored_after_max_attempts(make_app: MakeApp, stub: StubServer) -> None:
    stub.script("/hook/x", Reply(500))
    app = make_app(
        CONFIG.replace("max_attempts: 3, initial_delay: 1s", "max_attempts: 2, initial_delay: 1s")
    )
    with running(app):
        enter_action(app, "x")
        stub.wait_for(lambda: len(stub.received()) == 2, timeout=10)
        label = wait_errored(app, "x")
    assert len(stub.received()) == 2
    assert label.state == "notify"
    assert label.due_at is None  # errored: no third attempt is scheduled
    assert label.last_error is not None
    assert "status 500" in label.last_error and "attempt 2 of 2" in label.last_error


def test_action_retry_overrides_the_machine(make_app: MakeApp, stub: StubServer) -> None:
    stub.script("/hook/x", Reply(500))
    config = CONFIG.replace(
        'webhook: "{stub}/hook/<label>"',
        'webhook: "{stub}/hook/<label>"\n        retry: {max_attempts: 1}',
    )
    app = make_app(config)
    with running(app):
        enter_action(app, "x")
        stub.wait_for(lambda: len(stub.received()) == 1)
        wait_errored(app, "x")
    assert len(stub.received()) == 1


def test_410_errors_at_once(make_app: MakeApp, stub: StubServer) -> None:
    stub.script("/hook/x", Reply(410))
    app = make_app(CONFIG)
    with running(app):
        enter_action(app, "x")
        stub.wait_for(lambda: len(stub.received()) == 1)
        label = wait_errored(app, "x")
    assert len(stub.received()) == 1
    assert label.state == "notify"
    assert label.due_at is None  # errored: no retry is scheduled
    assert label.last_error is not None and "status 410" in label.last_error


def test_timeout_is_a_retryable_failure(make_app: MakeApp, stub: StubServer) -> None:
    stub.script("/hook/x", Reply(200, delay=2.0), Reply(200))
    config = CONFIG.replace("multiplier: 2}", "multiplier: 2, timeout: 1s}")
    app = make_app(config)
    with running(app):
        enter_action(app, "x")
        wait_for_state(app, "x", "done", timeout=10)
    assert len(stub.received()) == 2


SIGNED = """
state_machines:
  m:
    signing_secret: topsecret
    webhooks:
      - match: '127\\.0\\.0\\.1:\\d+/hook/'
        headers: {Authorization: Bearer abc}
      - match: 'example\\.com'
        headers: {X-Never: nope}
    states:
      - gate: start
        triggers: [{metadata: n}]
        exit_condition: metadata.n is defined
        next: notify
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: done
      - gate: done
        exit_condition: false
"""


def test_signed_deliveries_carry_matching_headers(make_app: MakeApp, stub: StubServer) -> None:
    app = make_app(SIGNED)
    with running(app):
        enter_action(app, "x")
        wait_for_state(app, "x", "done")
    [request] = stub.received()
    headers = request.headers
    assert headers["Authorization"] == "Bearer abc"
    assert "X-Never" not in headers
    assert headers["webhook-id"] == headers["X-Idempotency-Token"]
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
    digest = hmac.new(b"topsecret", signed, hashlib.sha256).digest()
    assert headers["webhook-signature"] == "v1," + base64.b64encode(digest).decode()


@pytest.mark.parametrize("concurrency", [1, 8])
def test_deliveries_run_in_parallel_over_kept_alive_connections(
    make_app: MakeApp, stub: StubServer, concurrency: int
) -> None:
    for index in range(8):
        stub.script(f"/hook/l{index}", Reply(200, delay=0.3))
    app = make_app(CONFIG, delivery_concurrency=concurrency)
    for index in range(8):
        enter_action(app, f"l{index}")
    with running(app):
        for index in range(8):
            wait_for_state(app, f"l{index}", "done")
    ports = {r.client_port for r in stub.received()}
    if concurrency == 1:
        assert stub.most_in_flight == 1
        assert len(ports) == 1  # one connection, kept alive
    else:
        assert stub.most_in_flight >= 4  # the 0.3 s replies overlapped
        assert len(ports) <= 8
