"""``/subscriptions``: storing push subscriptions, their validation, where they may send, scope."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.metrics import Metrics
from routemaster.service.retention import prune
from routemaster.web import create_app
from tests.api.conftest import CONFIG_PATH
from tests.api.helpers import body
from tests.api.openapi_check import CheckedClient
from tests.api.tokens import bearer, secured_api, tokens_layer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock

PUBLIC = "http://93.184.216.34/hooks"  # an address on the internet (never called here)
LABELS = "/state-machines/user/labels"


def _pending(client: FlaskClient, path: str, count: int) -> dict[str, Any]:
    """``path``'s subscription once it shows ``count`` changes pending: the lag counts changes
    below the stream's horizon, which on Citus the workers confirm a moment after a write."""
    return wait_until(
        lambda: (shown := body(client.get(path)))["pending"] == count and shown,
        f"{path} with {count} pending",
    )


def _client(db_engine: sa.Engine, tmp_path: Path, layer: str) -> FlaskClient:
    path = tmp_path / "layer.yaml"
    path.write_text(layer)
    flask_app = create_app(App(config=load_config([CONFIG_PATH, path]), db=db_engine))
    flask_app.test_client_class = CheckedClient
    return flask_app.test_client()


@pytest.fixture
def allowing(db_engine: sa.Engine, tmp_path: Path) -> FlaskClient:
    """The API with 127.0.0.1 allowed for subscriptions."""
    return _client(db_engine, tmp_path, "subscriptions:\n  allow: ['^http://127\\.0\\.0\\.1:']\n")


def test_a_new_subscription_starts_at_the_present_with_the_defaults(client: FlaskClient) -> None:
    client.post(LABELS + "/before", json={"metadata": {}})
    created = client.put("/subscriptions/orders", json={"url": PUBLIC})
    assert created.status_code == 201
    shown = body(created)
    assert shown["name"] == "orders"
    assert shown["url"] == PUBLIC
    assert shown["state_machines"] is None
    assert (shown["max_events"], shown["batch_delay_ms"]) == (100, 500)
    assert shown["signing_secret_env"] is None
    assert shown["pending"] == 0  # the label made before it is not pending
    assert shown["in_flight"] is None and shown["failures_in_a_row"] == 0
    client.post(LABELS + "/after", json={"metadata": {}})
    later = _pending(client, "/subscriptions/orders", 1)
    assert later["oldest_pending_at"] is not None
    assert later["cursor"] == shown["cursor"]


def test_replacing_keeps_the_cursor_and_listing_and_deleting(client: FlaskClient) -> None:
    first = body(client.put("/subscriptions/a", json={"url": PUBLIC}))
    client.post(LABELS + "/x", json={"metadata": {}})
    _pending(client, "/subscriptions/a", 1)
    replaced = client.put(
        "/subscriptions/a",
        json={
            "url": PUBLIC + "/2",
            "max_events": 5,
            "batch_delay_ms": 0,
            "state_machines": ["user"],
        },
    )
    assert replaced.status_code == 200
    shown = body(replaced)
    assert shown["cursor"] == first["cursor"]
    assert (shown["url"], shown["max_events"], shown["batch_delay_ms"]) == (PUBLIC + "/2", 5, 0)
    assert shown["state_machines"] == ["user"] and shown["pending"] == 1
    client.put("/subscriptions/b", json={"url": PUBLIC, "state_machines": ["empty"]})
    listed = body(client.get("/subscriptions"))["subscriptions"]
    assert [(s["name"], s["pending"]) for s in listed] == [("a", 1), ("b", 0)]
    assert client.delete("/subscriptions/a").status_code == 204
    assert client.get("/subscriptions/a").status_code == 404
    assert client.delete("/subscriptions/a").status_code == 404
    assert client.post("/subscriptions/a/cursor", json={"after": "1-1"}).status_code == 404


def test_replaying_from_a_position(client: FlaskClient) -> None:
    start = body(client.put("/subscriptions/s", json={"url": PUBLIC}))["cursor"]
    for name in ("a", "b", "c"):
        client.post(f"{LABELS}/{name}", json={"metadata": {}})
    _pending(client, "/subscriptions/s", 3)
    moved = client.post("/subscriptions/s/cursor", json={"after": start})
    assert moved.status_code == 200 and body(moved)["pending"] == 3
    again = body(client.put("/subscriptions/t", json={"url": PUBLIC, "after": start}))
    assert again["cursor"] == start and again["pending"] == 3


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"url": "ftp://example.com/"}, "invalid_url"),
        ({"url": "example.com/hooks"}, "invalid_url"),
        ({"url": "http://user:pw@93.184.216.34/"}, "invalid_url"),
        ({"url": 5}, "invalid"),
        ({}, "invalid"),
        ({"url": PUBLIC, "max_events": 0}, "invalid"),
        ({"url": PUBLIC, "max_events": 1001}, "invalid"),
        ({"url": PUBLIC, "max_events": True}, "invalid"),
        ({"url": PUBLIC, "batch_delay_ms": -1}, "invalid"),
        ({"url": PUBLIC, "batch_delay_ms": 3_600_001}, "invalid"),
        ({"url": PUBLIC, "signing_secret_env": "HOME"}, "invalid"),
        ({"url": PUBLIC, "signing_secret_env": "ROUTEMASTER_SUBSCRIPTION_SECRET_"}, "invalid"),
        ({"url": PUBLIC, "state_machines": ["nope"]}, "invalid"),
        ({"url": PUBLIC, "state_machines": []}, "invalid"),
        ({"url": PUBLIC, "state_machines": [{}]}, "invalid"),
        ({"url": PUBLIC, "state_machines": [1]}, "invalid"),
        ({"url": PUBLIC, "state_machines": [["user"]]}, "invalid"),
        ({"url": PUBLIC, "state_machines": "user"}, "invalid"),
        ({"url": PUBLIC, "after": "yesterday"}, "invalid_cursor"),
        ({"url": PUBLIC, "after": "99999999999-0"}, "invalid_cursor"),  # ahead of the stream
        ({"url": PUBLIC, "colour": "red"}, "invalid"),
    ],
)
def test_bad_subscriptions_are_400_with_a_reason(
    client: FlaskClient, fields: dict[str, Any], reason: str
) -> None:
    response = client.put("/subscriptions/s", json=fields)
    assert response.status_code == 400, body(response)
    assert body(response)["reason"] == reason
    assert client.get("/subscriptions/s").status_code == 404


@pytest.mark.parametrize("machines", [[{}], [1], [None], "user", {"user": 1}])
def test_state_machines_that_are_not_a_list_of_names_are_refused_plainly(
    client: FlaskClient, machines: Any
) -> None:
    response = client.put("/subscriptions/s", json={"url": PUBLIC, "state_machines": machines})
    assert response.status_code == 400
    assert body(response)["message"] == (
        '"state_machines" must be a non-empty list of state machine names.'
    )


def test_the_documented_secret_pattern_accepts_what_the_server_accepts(
    client: FlaskClient,
) -> None:
    document = body(client.get("/openapi.json"))
    pattern = document["components"]["schemas"]["SubscriptionBody"]["properties"][
        "signing_secret_env"
    ]["pattern"]
    name = "ROUTEMASTER_SUBSCRIPTION_SECRET_HOOKS"
    assert re.search(pattern, name)
    created = client.put("/subscriptions/s", json={"url": PUBLIC, "signing_secret_env": name})
    assert created.status_code == 201
    for refused in ("HOME", "ROUTEMASTERSUBSCRIPTION_SECRET_X", "ROUTEMASTER_SUBSCRIPTION_SECRET_"):
        assert not re.search(pattern, refused)


def test_names_are_url_safe(client: FlaskClient) -> None:
    assert client.put("/subscriptions/a.b-c_d~1", json={"url": PUBLIC}).status_code == 201
    for name in ("a%20b", "%C3%A9t%C3%A9", "..", "a" * 201):
        response = client.put(f"/subscriptions/{name}", json={"url": PUBLIC})
        assert response.status_code == 400, name
        assert body(response)["reason"] == "invalid_name"


def test_a_bad_cursor_is_400(client: FlaskClient) -> None:
    client.put("/subscriptions/s", json={"url": PUBLIC})
    for payload in ({"after": "x"}, {}, {"after": 5}, {"after": "1-1", "more": 1}):
        response = client.post("/subscriptions/s/cursor", json=payload)
        assert response.status_code == 400, payload


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hooks",
        "http://10.1.2.3/hooks",
        "http://192.168.0.7/hooks",
        "https://169.254.169.254/latest/meta-data",
        "http://[::1]/hooks",
        "http://localhost/hooks",  # a name that resolves to loopback
        "http://0.0.0.0/",
    ],
)
def test_addresses_inside_the_network_are_refused(client: FlaskClient, url: str) -> None:
    response = client.put("/subscriptions/s", json={"url": url})
    assert response.status_code == 400
    assert body(response)["reason"] == "forbidden_address"
    assert "inside the network" in body(response)["message"]


def test_the_configuration_may_allow_an_origin(allowing: FlaskClient) -> None:
    assert (
        allowing.put("/subscriptions/s", json={"url": "http://127.0.0.1:8080/"}).status_code == 201
    )
    refused = allowing.put("/subscriptions/t", json={"url": "http://10.0.0.1:8080/"})
    assert refused.status_code == 400


@pytest.fixture
def secured(db_engine: sa.Engine, tmp_path: Path) -> Iterator[flask.Flask]:
    app = App(config=load_config([CONFIG_PATH, tokens_layer(tmp_path)]), db=db_engine)
    with secured_api(app) as flask_app:
        yield flask_app


def test_every_subscription_endpoint_needs_the_admin_scope(
    secured: flask.Flask, db_engine: sa.Engine
) -> None:
    client = secured.test_client()

    others = bearer(db_engine, "read", "write", "operate")
    admin = bearer(db_engine, "admin")
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("PUT", "/subscriptions/s", {"url": PUBLIC}),
        ("GET", "/subscriptions", None),
        ("GET", "/subscriptions/s", None),
        ("POST", "/subscriptions/s/cursor", {"after": "1-0"}),
        ("DELETE", "/subscriptions/s", None),
    ]
    for method, path, payload in calls:
        assert client.open(path, method=method, json=payload).status_code == 401
        assert client.open(path, method=method, json=payload, headers=others).status_code == 403
    for method, path, payload in calls:
        answered = client.open(path, method=method, json=payload, headers=admin)
        assert answered.status_code < 300, (method, path, answered.data)


def test_lag_is_a_gauge_per_subscription_in_metrics(db_engine: sa.Engine) -> None:
    flask_app = create_app(
        App(
            config=load_config([CONFIG_PATH]),
            db=db_engine,
            settings=Settings(label_gauges_interval=0),
            metrics=Metrics(),
        )
    )
    client = flask_app.test_client()
    client.put("/subscriptions/orders", json={"url": PUBLIC})
    client.post(LABELS + "/a", json={"metadata": {}})
    client.post(LABELS + "/b", json={"metadata": {}})
    pending = 'routemaster_subscription_pending{subscription="orders"} 2.0'

    def scraped() -> str | None:
        text = client.get("/metrics").get_data(as_text=True)
        return text if pending in text else None

    text = wait_until(scraped, "two pending in /metrics")
    assert 'routemaster_subscription_failures_in_a_row{subscription="orders"} 0.0' in text
    assert 'routemaster_subscription_oldest_pending_seconds{subscription="orders"}' in text


def test_the_console_lists_subscriptions_and_their_lag(client: FlaskClient) -> None:
    client.put("/subscriptions/orders", json={"url": PUBLIC})
    client.post(LABELS + "/a", json={"metadata": {}})
    _pending(client, "/subscriptions/orders", 1)
    page = client.get("/console/subscriptions")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert 'data-subscription="orders"' in html and PUBLIC in html
    assert '<td class="n">1</td>' in html  # pending
    assert 'href="/console/subscriptions"' in client.get("/console/").get_data(as_text=True)


def test_what_retention_removed_before_it_was_sent_shows_as_lost_events(
    db_engine: sa.Engine, tmp_path: Path
) -> None:
    layer = tmp_path / "retention.yaml"
    layer.write_text("retention:\n  history: 1h\n")
    clock = FakeClock(datetime.datetime.now(datetime.UTC))
    app = App(
        config=load_config([CONFIG_PATH, layer]),
        db=db_engine,
        settings=Settings(label_gauges_interval=0),
        metrics=Metrics(),
    )
    app.clock = clock
    client = create_app(app).test_client()
    assert client.put("/subscriptions/orders", json={"url": PUBLIC}).status_code == 201
    client.post(LABELS + "/a", json={"metadata": {}})
    client.patch(LABELS + "/a", json={"metadata": {"ready": True, "route": "fast"}})
    clock.advance(hours=2)
    assert prune(app).rows["history"] == 1  # a's creation; its move to done is its current entry

    shown = body(client.get("/subscriptions/orders"))
    assert shown["lost_events"] == 1
    text = client.get("/metrics").get_data(as_text=True)
    assert 'routemaster_subscription_lost_events_total{subscription="orders"} 1.0' in text
    assert 'routemaster_retention_rows_pruned_total{table="history"} 1.0' in text
    html = client.get("/console/subscriptions").get_data(as_text=True)
    assert '<span class="errored">1</span>' in html
