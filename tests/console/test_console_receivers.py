"""The console's receivers page (with pause and resume) and a label's last deliveries."""

from __future__ import annotations

import datetime

from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.db import deliveries
from routemaster.db.deliveries import Delivery
from tests.console.test_console import LABELS, _csrf, _page, _text

RECEIVER = "http-127.0.0.1-9"  # the action webhook of tests/api/config.yaml


def test_receivers_page_shows_each_receiver_and_pauses_it(client: FlaskClient) -> None:
    html = _page(client, "/console/receivers")
    text = _text(html)
    assert "http://127.0.0.1:9" in text and RECEIVER in text
    assert "closed" in text
    paused = client.post(f"/console/receivers/{RECEIVER}/pause", data={"csrf": _csrf(html)})
    assert paused.status_code == 303
    assert client.get("/receivers").get_json()["receivers"][0]["state"] == "paused"
    assert "Resume" in _page(client, "/console/receivers")
    forged = client.post(f"/console/receivers/{RECEIVER}/resume", data={"csrf": "guess"})
    assert forged.status_code == 403
    assert client.get("/receivers").get_json()["receivers"][0]["state"] == "paused"


def test_label_page_shows_its_last_deliveries_and_failures_show_on_receivers(
    client: FlaskClient, app: App
) -> None:
    client.post(f"{LABELS}/ann", json={"metadata": {}})
    client.patch(f"{LABELS}/ann", json={"metadata": {"ready": True, "approved": True}})
    with app.db.begin() as conn:
        deliveries.record(
            conn,
            [
                Delivery(
                    kind="webhook",
                    state_machine="user",
                    label="ann",
                    state="notify",
                    url="http://127.0.0.1:9/hooks/ann",
                    receiver=RECEIVER,
                    attempt=1,
                    trigger="scheduled",
                    started_at=datetime.datetime.now(datetime.UTC),
                    duration_ms=12,
                    status=503,
                    outcome="failed",
                    error="POST http://127.0.0.1:9/hooks/ann returned status 503",
                    response_excerpt="maintenance",
                )
            ],
        )
    text = _text(_page(client, "/console/machines/user/labels/ann"))
    assert "Last deliveries" in text
    assert "returned status 503" in text
    receivers = _text(_page(client, "/console/receivers"))
    assert "Recent failures" in receivers and "ann" in receivers and "failed" in receivers
