"""One call at a time through a receiver (the interface subscription batches use)."""

from __future__ import annotations

import datetime

from routemaster.app import App
from routemaster.http.calls import send_logged
from routemaster.service.receiver_calls import Allowed, acquire, record_call
from tests.stub_server import Reply, StubServer
from tests.worker.conftest import FakeClock, MakeApp
from tests.worker.test_delivery_log import client_of
from tests.worker.test_receivers import CONFIG


def call(app: App, url: str, allowed: Allowed) -> None:
    made, _ = send_logged(
        app.http, "POST", url, headers={}, body=b"{}", timeout=2, started_at=app.now()
    )
    with app.db.begin() as conn:
        record_call(conn, app, allowed, made)


def test_calls_wait_on_an_open_circuit_and_probe_after_the_cooldown(
    make_app: MakeApp, stub: StubServer
) -> None:
    clock = FakeClock(datetime.datetime(2026, 11, 24, 12, tzinfo=datetime.UTC))
    app = make_app(CONFIG, clock=clock)
    url = stub.url("/events?secret=1")
    stub.script("/events", Reply(503), Reply(503), Reply(503), Reply(200))
    for _ in range(3):
        allowed = acquire(app, url)
        assert isinstance(allowed, Allowed) and not allowed.probe
        call(app, url, allowed)
    wait = acquire(app, url)
    assert wait == clock() + datetime.timedelta(seconds=1)  # the cooldown
    clock.advance(seconds=1)
    probe = acquire(app, url)
    assert isinstance(probe, Allowed) and probe.probe
    assert isinstance(acquire(app, url), datetime.datetime)  # one probe at a time
    call(app, url, probe)
    assert isinstance(acquire(app, url), Allowed)  # closed again
    log = client_of(app).get("/deliveries?kind=subscription").get_json()["deliveries"]
    assert [(d["outcome"], d["trigger"]) for d in log] == [
        ("delivered", "probe"),
        ("failed", "scheduled"),
        ("failed", "scheduled"),
        ("failed", "scheduled"),
    ]
    assert log[0]["url"].endswith("/events?secret=REDACTED")
