"""A receiver's rate and max_in_flight hold across workers; an outage becomes a backlog."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster import service
from routemaster.service.delivery_claims import RATE_TOLERANCE
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running
from tests.worker.notify import notify_config
from tests.worker.test_delivery_log import client_of

RATED = notify_config(receiver="rate: 100/s, max_in_flight: 6")
RATE = 100  # calls per second, as RATED says

# A call is admitted when a worker claims it and recorded when the stub receives it; on a
# loaded machine the two may be this far apart at either end of the run, shortening the
# span the stub sees (a tolerance for the measurement, not for the limit).
SENDING_LAG = 0.2


def test_a_rate_holds_across_two_workers(make_app: MakeApp, stub: StubServer) -> None:
    """The rate is a ceiling across workers: over the run, the calls are at most the rate
    plus the burst the limiter lets go at once, however fast the machine."""
    first = make_app(RATED, delivery_concurrency=8)
    second = make_app(RATED, delivery_concurrency=8)
    machine = first.config.get_machine("m")
    for i in range(600):
        service.create_label(first, machine, f"l{i:03}", {})
    with ExitStack() as stack:
        stack.enter_context(running(first))
        stack.enter_context(running(second))
        stub.wait_for(lambda: len(stub.received()) >= 500, timeout=60)
        with first.db.connect() as conn:  # both take part, each counting its calls in flight
            workers = set(conn.execute(sa.text("SELECT worker FROM receiver_slots")).scalars())
    arrivals = sorted(request.at for request in stub.received())
    span = arrivals[-1] - arrivals[0]
    ceiling = RATE * (span + SENDING_LAG) + RATE * RATE_TOLERANCE
    assert len(arrivals) <= ceiling, f"{len(arrivals)} calls in {span:.2f} s"
    # Work was done at a useful pace: a quarter of the rate (a loaded machine keeps up).
    assert len(arrivals) >= RATE / 4 * span, f"{len(arrivals)} calls in {span:.2f} s"
    assert stub.most_in_flight <= 6
    assert workers == {first.settings.worker_id, second.settings.worker_id}
    with first.db.connect() as conn:  # stopped, they hold none of the receiver's share
        held = "SELECT count(*) FROM receiver_slots WHERE in_flight > 0 AND expires_at > now()"
        assert not conn.execute(sa.text(held)).scalar()


DRILL = notify_config(
    retry="max_attempts: 3, initial_delay: 1s, max_delay: 2s",
    receiver="circuit: {failures: 5, cooldown: 1s}",
)


def test_an_outage_becomes_a_backlog_drained_in_order(make_app: MakeApp, stub: StubServer) -> None:
    """The receiver answers 503 for a while: nothing errors, nothing is delivered twice."""
    names = [f"l{i:03}" for i in range(60)]
    for name in names:
        stub.script(f"/hook/{name}", Reply(503))
    app = make_app(DRILL, delivery_concurrency=1)
    client = client_of(app)
    machine = app.config.get_machine("m")
    with running(app):
        for name in names:
            service.create_label(app, machine, name, {})
        wait_until(
            lambda: len([d for d in _deliveries(client) if d["trigger"] == "probe"]) >= 3,
            "three probes during the outage",
            timeout=15,
        )
        during = len(stub.received())
        for name in names:
            stub.script(f"/hook/{name}", Reply(200))
        wait_until(
            lambda: all(service.get_label(app, machine, name).state == "done" for name in names),
            "drained",
            timeout=20,
        )
    assert not any(service.get_label(app, machine, name).errored for name in names)
    log = _deliveries(client)
    assert during <= 5 + 1 + len([d for d in log if d["trigger"] == "probe"])
    delivered = [d["label"] for d in reversed(log) if d["outcome"] == "delivered"]
    assert sorted(delivered) == names  # each exactly once
    failed_first = {
        d["label"] for d in log if d["trigger"] == "scheduled" and d["outcome"] != "delivered"
    }
    waited = [name for name in delivered if name not in failed_first]
    assert waited == sorted(waited)  # the backlog in the order it fell due


def _deliveries(client: FlaskClient) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get("/deliveries?limit=1000").get_json()["deliveries"]
    return found
