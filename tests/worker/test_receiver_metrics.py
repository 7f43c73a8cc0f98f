"""Metrics per receiver: calls by outcome, with latency (worker); state and backlog (API)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from routemaster import service
from routemaster.metrics import Metrics
from routemaster.web import create_app
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running
from tests.worker.test_receivers import CONFIG, receiver_id

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_calls_are_counted_per_receiver_and_its_state_is_a_gauge(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/hook/ok", Reply(200))
    stub.script("/hook/bad", Reply(503))
    app = make_app(CONFIG, label_gauges_interval=0)
    app.metrics = Metrics()
    machine = app.config.get_machine("m")
    with running(app):
        service.create_label(app, machine, "ok", {})
        service.create_label(app, machine, "bad", {})
        wait_until(lambda: len(stub.received()) >= 2, "both called", timeout=10)
    ident = receiver_id(stub)
    worker = samples(generate_latest(app.metrics.registry()).decode())
    webhook = ("receiver", ident), ("kind", "webhook")
    assert (
        worker[
            ("routemaster_receiver_calls_total", frozenset({*webhook, ("outcome", "delivered")}))
        ]
        == 1
    )
    assert (
        worker[("routemaster_receiver_calls_total", frozenset({*webhook, ("outcome", "failed")}))]
        >= 1
    )
    assert (
        worker[
            (
                "routemaster_receiver_call_duration_seconds_count",
                frozenset({*webhook, ("outcome", "delivered")}),
            )
        ]
        == 1
    )
    api = samples(create_app(app).test_client().get("/metrics").get_data(as_text=True))
    assert (
        api[("routemaster_receiver_state", frozenset({("receiver", ident), ("state", "closed")}))]
        == 1
    )
    assert (
        api[("routemaster_receiver_state", frozenset({("receiver", ident), ("state", "open")}))]
        == 0
    )
    assert ("routemaster_receiver_failures_in_a_row", frozenset({("receiver", ident)})) in api
    assert api[("routemaster_receiver_waiting", frozenset({("receiver", ident)}))] == 0
    assert ("routemaster_receiver_in_flight", frozenset({("receiver", ident)})) in api
