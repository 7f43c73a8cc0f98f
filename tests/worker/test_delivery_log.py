"""The delivery log: every webhook and feed call the worker makes, as the API shows it."""

from __future__ import annotations

import datetime
import json
from typing import Any

import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster import service
from routemaster.app import App
from routemaster.db import deliveries
from routemaster.db.deliveries import Delivery
from routemaster.service.upkeep import PRUNE_BATCH, prune_deliveries
from routemaster.web import create_app
from tests.api.openapi_check import CheckedClient
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running
from tests.worker.notify import create

CONFIG = """
state_machines:
  m:
    retry: {max_attempts: 3, initial_delay: 1h, timeout: 1s}
    webhooks:
      - match: 'hook'
        headers: {Authorization: 'Bearer s3cret-header'}
    states:
      - action: notify
        webhook: "{stub}/hook/<label>?token=s3cret-query"
        next: done
      - gate: done
        exit_condition: false
"""


def client_of(app: App) -> FlaskClient:
    flask_app = create_app(app)
    flask_app.test_client_class = CheckedClient  # every response checked against the OpenAPI
    return flask_app.test_client()


def label_deliveries(client: FlaskClient, name: str, **query: str) -> list[dict[str, Any]]:
    response = client.get(f"/state-machines/m/labels/{name}/deliveries", query_string=query)
    assert response.status_code == 200, response.data
    found: list[dict[str, Any]] = response.get_json()["deliveries"]
    return found


def test_each_outcome_is_recorded_with_status_error_and_excerpt(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/hook/ok", Reply(200, b'{"thanks": true}'))
    stub.script("/hook/gone", Reply(410, b"no such customer"))
    stub.script("/hook/broken", Reply(500, b"oops"))
    stub.script("/hook/busy", Reply(429, b"slow down", headers=(("Retry-After", "1"),)))
    stub.script("/hook/slow", Reply(200, delay=1.5))
    stub.script("/hook/huge", Reply(500, b"x" * 5000))
    app = make_app(CONFIG)
    names = ["ok", "gone", "broken", "busy", "slow", "huge"]
    client = client_of(app)
    with running(app):
        create(app, *names)
        wait_until(
            lambda: all(label_deliveries(client, name) for name in names),
            "every label's first call recorded",
            timeout=10,
        )
    first = {name: label_deliveries(client, name)[-1] for name in names}
    assert {name: entry["outcome"] for name, entry in first.items()} == {
        "ok": "delivered",
        "gone": "gone",
        "broken": "failed",
        "busy": "throttled",
        "slow": "timeout",
        "huge": "failed",
    }
    assert first["ok"]["status"] == 200
    assert first["ok"]["response_excerpt"] == '{"thanks": true}'
    assert first["ok"]["error"] is None
    assert first["ok"]["kind"] == "webhook"
    assert first["ok"]["trigger"] == "scheduled"
    assert first["ok"]["attempt"] == 1
    assert first["ok"]["receiver"] == "http-127.0.0.1-" + stub.url("").rsplit(":", 1)[1]
    assert (first["ok"]["state_machine"], first["ok"]["state"]) == ("m", "notify")
    assert first["gone"]["response_excerpt"] == "no such customer"
    assert "returned status 500" in first["broken"]["error"]
    assert first["slow"]["status"] is None
    assert "timed out" in first["slow"]["error"]
    assert first["slow"]["duration_ms"] >= 900
    assert len(first["huge"]["response_excerpt"]) == 1024  # the first KiB, no more


def test_a_refused_connection_is_a_network_failure(make_app: MakeApp) -> None:
    app = make_app(CONFIG.replace("{stub}", "http://127.0.0.1:9"))  # discard port: refused
    client = client_of(app)
    with running(app):
        create(app, "x")
        wait_until(lambda: bool(label_deliveries(client, "x")), "the call recorded", timeout=10)
    [entry] = label_deliveries(client, "x")
    assert (entry["outcome"], entry["status"], entry["response_excerpt"]) == ("network", None, None)
    assert entry["receiver"] == "http-127.0.0.1-9"


def test_secrets_are_never_stored(
    make_app: MakeApp, stub: StubServer, db_engine: sa.Engine
) -> None:
    config = CONFIG.replace("{stub}", stub.url("").replace("://", "://alice:pa55word@"))
    app = make_app(config)
    client = client_of(app)
    with running(app):
        create(app, "x")
        wait_until(lambda: bool(label_deliveries(client, "x")), "the call recorded", timeout=10)
    [request] = stub.received()
    assert request.headers["Authorization"].startswith("Basic")  # sent, as configured...
    [entry] = label_deliveries(client, "x")
    assert entry["url"] == stub.url("").replace("://", "://REDACTED@") + "/hook/x?token=REDACTED"
    with db_engine.connect() as conn:
        stored = json.dumps(
            [list(row) for row in conn.execute(sa.text("SELECT * FROM deliveries"))], default=str
        )
    for secret in ("alice", "pa55word", "s3cret-query", "s3cret-header", "Bearer"):
        assert secret not in stored  # ...but never kept


def test_feed_fetches_are_recorded(make_app: MakeApp, stub: StubServer) -> None:
    stub.reply_json("/feed/a", {"ready": False})
    app = make_app(
        """
state_machines:
  m:
    feeds: [{name: f, url: "{stub}/feed/<label>?key=k"}]
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: feeds.f.ready = true
        next: done
      - gate: done
        exit_condition: false
"""
    )
    client = client_of(app)
    create(app, "a")
    service.update_metadata(app, app.config.get_machine("m"), "a", {"go": 1})
    [entry] = label_deliveries(client, "a")
    assert (entry["kind"], entry["outcome"], entry["status"]) == ("feed", "delivered", 200)
    assert entry["url"].endswith("/feed/a?key=REDACTED")
    assert entry["response_excerpt"] == '{"ready": false}'
    assert entry["attempt"] is None


def test_listing_filters_and_pages_newest_first(make_app: MakeApp, stub: StubServer) -> None:
    for name in ("a", "b", "c"):
        stub.script(f"/hook/{name}", Reply(200))
    stub.script("/hook/bad", Reply(503))
    app = make_app(CONFIG)
    client = client_of(app)
    with running(app):
        create(app, "a", "b", "c", "bad")
        wait_until(
            lambda: len(client.get("/deliveries").get_json()["deliveries"]) == 4,
            "4 calls",
            timeout=10,
        )
    page = client.get("/deliveries?limit=2").get_json()
    assert len(page["deliveries"]) == 2
    ids = [entry["id"] for entry in page["deliveries"]]
    assert ids == sorted(ids, reverse=True)
    rest = client.get(page["next"]).get_json()
    assert len(rest["deliveries"]) == 2 and rest["next"] is None
    assert max(entry["id"] for entry in rest["deliveries"]) < min(ids)
    failed = client.get("/deliveries?outcome=failed").get_json()["deliveries"]
    assert [entry["label"] for entry in failed] == ["bad"]
    assert client.get("/deliveries?kind=feed").get_json()["deliveries"] == []
    later = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()
    assert client.get("/deliveries", query_string={"since": later}).get_json()["deliveries"] == []
    assert (
        len(client.get("/deliveries", query_string={"until": later}).get_json()["deliveries"]) == 4
    )
    assert client.get("/deliveries?outcome=fine").status_code == 400
    assert client.get("/deliveries?since=yesterday").status_code == 400
    assert client.get("/deliveries?before=x").status_code == 400
    assert client.get("/state-machines/m/labels/nobody/deliveries").status_code == 404
    explained = client.get("/state-machines/m/labels/bad/explain").get_json()
    assert [entry["outcome"] for entry in explained["recent_deliveries"]] == ["failed"]


def test_old_deliveries_are_pruned_in_batches(make_app: MakeApp, db_engine: sa.Engine) -> None:
    app = make_app(CONFIG, delivery_retention=datetime.timedelta(days=14))
    now = app.now()
    old = [_entry(now - datetime.timedelta(days=15, minutes=i)) for i in range(PRUNE_BATCH + 500)]
    fresh = [_entry(now - datetime.timedelta(days=13)), _entry(now)]
    with db_engine.begin() as conn:
        deliveries.record(conn, [*old, *fresh])
    assert prune_deliveries(app) == len(old)
    with db_engine.connect() as conn:
        kept = deliveries.matching(conn, deliveries.DeliveryFilter(), limit=10)
    assert sorted(entry.started_at for entry in kept) == [fresh[0].started_at, fresh[1].started_at]


def _entry(started_at: datetime.datetime) -> Delivery:
    return Delivery(
        kind="webhook",
        state_machine="m",
        label="x",
        state="notify",
        url="http://example.com/x",
        receiver="http-example.com",
        attempt=1,
        trigger="scheduled",
        started_at=started_at,
        duration_ms=5,
        status=200,
        outcome="delivered",
        error=None,
        response_excerpt="",
    )
