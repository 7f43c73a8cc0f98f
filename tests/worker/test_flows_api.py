"""What a flow shows (SPEC G2): explain's ``waiting_for``, ``GET /flows``,
``GET /flows/{name}/keys`` and the gauges, while a worker holds keys at their cap."""

from __future__ import annotations

from typing import Any

from routemaster import service
from routemaster.metrics import Metrics
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running
from tests.worker.flow_receiver import flow_receiver
from tests.worker.test_delivery_log import client_of
from tests.worker.test_flows import flow_config


def test_waiting_labels_say_what_they_wait_for(make_app: MakeApp) -> None:
    with flow_receiver(delay=2.0) as receiver:
        config = flow_config(
            receiver.url(),
            "key: metadata.customer, concurrency: 1, name: pay",
            receiver="max_in_flight: 8",
        )
        app = make_app(config, delivery_concurrency=8, label_gauges_interval=0)
        app.metrics = Metrics()
        machine = app.config.get_machine("m")
        for name, customer in [
            ("a1", "acme"),
            ("a2", "acme"),
            ("a3", "acme"),
            ("b1", "bolt"),
            ("n1", None),
        ]:
            metadata: dict[str, Any] = {} if customer is None else {"customer": customer}
            service.create_label(app, machine, name, metadata)
        client = client_of(app)
        with running(app):
            wait_until(lambda: len(receiver.started) == 3, "one call per key", timeout=20)
            flows = client.get("/flows").get_json()["flows"]
            keys = client.get("/flows/pay/keys?limit=10").get_json()
            explained = client.get("/state-machines/m/labels/a3/explain").get_json()
            calling = client.get("/state-machines/m/labels/b1/explain").get_json()
            top = client.get("/flows/pay/keys?limit=1").get_json()["keys"]
            scraped = client.get("/metrics").get_data(as_text=True)
            page = client.get("/console/flows").get_data(as_text=True)
            missing = client.get("/flows/nope/keys")
            bad = client.get("/flows/pay/keys?limit=0")
    assert "<code>&#34;acme&#34;</code>" in page or '<code>"acme"</code>' in page  # busiest key
    assert "2 labels waiting over 1 keys" in page
    assert 'routemaster_flow_waiting{flow="pay"} 2.0' in scraped
    assert 'routemaster_flow_holding{flow="pay"} 3.0' in scraped
    assert flows == [
        {"name": "pay", "concurrency": 1, "keys_waiting": 1, "labels_waiting": 2, "holding": 3}
    ]
    assert keys["keys"][0] == {"key": "acme", "waiting": 2, "holding": 1}
    assert {"key": None, "waiting": 0, "holding": 1} not in keys["keys"]  # nothing waits there
    assert top == [{"key": "acme", "waiting": 2, "holding": 1}]
    waiting = explained["waiting_for"]
    assert {k: waiting[k] for k in ("flow", "key", "holding", "concurrency")} == {
        "flow": "pay",
        "key": "acme",
        "holding": 1,
        "concurrency": 1,
    }
    assert explained["attempts"] == 0  # waiting uses no attempt
    assert calling["waiting_for"] is None
    assert missing.status_code == 404 and "message" in missing.get_json()
    assert bad.status_code == 400 and "message" in bad.get_json()


def test_an_unnamed_flow_is_named_after_its_action(make_app: MakeApp) -> None:
    with flow_receiver(delay=0.01) as receiver:
        app = make_app(flow_config(receiver.url(), "key: metadata.customer"))
        flows = client_of(app).get("/flows").get_json()["flows"]
    assert [flow["name"] for flow in flows] == ["m.notify"]


def test_a_label_paused_while_waiting_gets_its_turn_once_resumed(make_app: MakeApp) -> None:
    """Paused in its key's queue, the key goes idle and is forgotten; resumed, the label is
    queued again and called."""
    with flow_receiver(delay=0.3) as receiver:
        config = flow_config(receiver.url(), "key: metadata.customer, concurrency: 1")
        app = make_app(config, delivery_concurrency=4)
        machine = app.config.get_machine("m")
        for name in ("first", "second"):
            service.create_label(app, machine, name, {"customer": "acme"})
        client = client_of(app)
        with running(app):
            wait_until(lambda: len(receiver.started) == 1, "the first called", timeout=20)
            wait_until(
                lambda: (
                    client.get("/state-machines/m/labels/second/explain").get_json()["waiting_for"]
                    is not None
                ),
                "the second queued behind it",
                timeout=20,
            )
            assert client.post("/state-machines/m/labels/second/pause", json={}).status_code == 200
            wait_until(
                lambda: service.get_label(app, machine, "first").state == "done",
                "the first delivered",
                timeout=20,
            )
            wait_until(
                lambda: client.get("/flows").get_json()["flows"][0]["holding"] == 0,
                "nothing holding",
                timeout=20,
            )
            assert len(receiver.started) == 1  # paused: never called
            assert client.post("/state-machines/m/labels/second/resume", json={}).status_code == 200
            wait_until(
                lambda: service.get_label(app, machine, "second").state == "done",
                "the second delivered after its resume",
                timeout=20,
            )
    assert [label for _, _, label in sorted(receiver.started)] == ["first", "second"]
