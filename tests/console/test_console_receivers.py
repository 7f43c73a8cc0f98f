"""The console's receivers page (with pause and resume) and a label's last deliveries."""

from __future__ import annotations

import datetime
import re

import pytest
import requests
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.db import deliveries
from routemaster.db.deliveries import Delivery
from tests.api.conftest import CONFIG_PATH
from tests.console.test_console import LABELS, _csrf, _page, _text
from tests.pooler import running_pgbouncer
from tests.serving import serving
from tests.waiting import wait_until

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


def _wakeups(base: str) -> dict[str, str]:
    """The receivers page's wake-ups table: listener -> what it says."""
    page = requests.get(f"{base}/console/receivers", timeout=10)
    assert page.status_code == 200
    table = page.text.partition('id="wakeups"')[2]
    return {
        listener: " ".join(re.sub(r"<[^>]+>", " ", said).split())
        for listener, said in re.findall(
            r'<tr data-listener="([^"]+)">.*?<td class="[^"]*">(.*?)</td>\s*</tr>', table, re.S
        )
    }


@pytest.mark.slow
def test_the_receivers_page_shows_how_the_servers_processes_hear_of_work(
    direct_database_url: str, db_engine: sa.Engine
) -> None:
    """``serve`` with its worker: on PostgreSQL itself the worker's wake-ups come by ``LISTEN``
    once its probe came back; through PgBouncer in transaction mode they are polled."""
    with serving(CONFIG_PATH, direct_database_url, with_worker=True) as base:
        wait_until(
            lambda: _wakeups(base).get("worker") == "at once (LISTEN)",
            lambda: f"the worker listening: {_wakeups(base)}",
            timeout=30,
        )
    with running_pgbouncer(direct_database_url, pool_size=5) as pooled:
        env = {"ROUTEMASTER_POLL_INTERVAL": "0.5"}
        with serving(CONFIG_PATH, pooled, with_worker=True, env=env) as base:
            wait_until(
                lambda: _wakeups(base).get("worker") == "polled every 0.5 s",
                lambda: f"the worker polling: {_wakeups(base)}",
                timeout=30,
            )


def test_receivers_page_says_where_label_reads_go(client: FlaskClient, app: App) -> None:
    """One server: through DATABASE_URL; on Citus (the Citus pass runs this module's twin,
    tests/console/test_label_reads_citus.py) each node holding shards is listed."""
    text = _text(_page(client, "/console/receivers")).partition("Label reads")[2]
    assert "Through DATABASE_URL (one PostgreSQL server)" in text
