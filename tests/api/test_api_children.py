"""``GET .../labels/{label}/children``, a child's ``parent``, a waiting parent's explanation
(SPEC G3), each answer checked against /openapi.json."""

from __future__ import annotations

from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.config import load_config
from routemaster.service.children import run_spawns
from routemaster.web import create_app
from tests.api.helpers import body
from tests.api.openapi_check import CheckedClient
from tests.metrics.test_metrics import metered_app, scrape, value
from tests.worker.children import config

ORDER = "/state-machines/order/labels"
ITEM = "/state-machines/item/labels"


@pytest.fixture
def spawning(tmp_path: Path, db_engine: sa.Engine) -> tuple[App, FlaskClient]:
    path = tmp_path / "config.yaml"
    path.write_text(config())
    app = App(config=load_config([path]), db=db_engine)
    flask_app: flask.Flask = create_app(app)
    flask_app.test_client_class = CheckedClient
    return app, flask_app.test_client()


def _spawned(app: App, client: FlaskClient, items: list[object]) -> None:
    """``o1`` created with ``items``, its children spawned (as the worker does)."""
    assert client.post(f"{ORDER}/o1", json={"metadata": {"items": items}}).status_code == 201
    while run_spawns(app, limit=10):
        pass


def test_a_child_shows_its_parent(spawning: tuple[App, FlaskClient]) -> None:
    app, client = spawning
    _spawned(app, client, ["a", "b"])
    child = body(client.get(f"{ITEM}/o1%2F1"))
    assert child["parent"] == {"state_machine": "order", "label": "o1"}
    assert child["metadata"] == {"item": "b", "parent": {"state_machine": "order", "label": "o1"}}
    assert "parent" not in body(client.get(f"{ORDER}/o1"))


def test_the_children_listing_pages_and_filters_by_outcome(
    spawning: tuple[App, FlaskClient],
) -> None:
    app, client = spawning
    _spawned(app, client, ["a", "b", "c"])
    client.patch(f"{ITEM}/o1%2F0", json={"metadata": {"ok": True}})
    client.patch(f"{ITEM}/o1%2F2", json={"metadata": {"bad": True}})
    listed = body(client.get(f"{ORDER}/o1/children"))
    assert [(c["label"], c["state"], c["outcome"]) for c in listed["children"]] == [
        ("o1/0", "picked", "succeeded"),
        ("o1/1", "waiting", None),
        ("o1/2", "broken", "failed"),
    ]
    assert listed["children"][1] == {
        "state_machine": "item",
        "label": "o1/1",
        "state": "waiting",
        "outcome": None,
        "metadata": {"item": "b", "parent": {"state_machine": "order", "label": "o1"}},
    }
    assert listed["next"] is None
    first = body(client.get(f"{ORDER}/o1/children?limit=2"))
    assert [c["label"] for c in first["children"]] == ["o1/0", "o1/1"]
    assert first["next"] == "/state-machines/order/labels/o1/children?limit=2&after=1"
    rest = body(client.get(first["next"]))
    assert ([c["label"] for c in rest["children"]], rest["next"]) == (["o1/2"], None)
    running = body(client.get(f"{ORDER}/o1/children?outcome=running"))
    assert [c["label"] for c in running["children"]] == ["o1/1"]
    failed = body(client.get(f"{ORDER}/o1/children?outcome=failed"))
    assert [c["label"] for c in failed["children"]] == ["o1/2"]


def test_bad_listing_requests_are_refused(spawning: tuple[App, FlaskClient]) -> None:
    _, client = spawning
    assert client.get(f"{ORDER}/nobody/children").status_code == 404
    refused = client.get(f"{ORDER}/o1/children?outcome=maybe")
    assert refused.status_code == 400
    assert "outcome" in body(refused)["message"]


def test_a_waiting_parent_explains_its_counts(spawning: tuple[App, FlaskClient]) -> None:
    app, client = spawning
    _spawned(app, client, ["a", "b"])
    client.patch(f"{ITEM}/o1%2F0", json={"metadata": {"ok": True}})
    explained = body(client.get(f"{ORDER}/o1/explain"))
    assert explained["kind"] == "spawn"
    assert explained["children"] == {"total": 2, "succeeded": 1, "failed": 0, "running": 1}
    assert explained["spawn"]["spawned"] == 2
    assert explained["wait_met"] is False


def test_the_console_shows_a_waiting_parents_children(spawning: tuple[App, FlaskClient]) -> None:
    app, client = spawning
    _spawned(app, client, ["a", "b", "c"])
    client.patch(f"{ITEM}/o1%2F0", json={"metadata": {"ok": True}})
    client.delete(f"{ITEM}/o1%2F1")
    page = client.get("/console/machines/order/labels/o1")
    assert page.status_code == 200
    text = " ".join(page.get_data(as_text=True).split())
    assert "one <strong>item</strong> child per element of <code>metadata.items</code>" in text
    assert (
        'Children: <strong>3</strong> in all, <span class="held">1 succeeded</span>,'
        ' <span class="failed">1 failed</span>, 1 running.'
    ) in text
    assert 'href="/state-machines/order/labels/o1/children"' in text


def test_a_finish_no_writer_recorded_is_found_when_the_parent_counts(
    spawning: tuple[App, FlaskClient], db_engine: sa.Engine
) -> None:
    app, client = spawning
    _spawned(app, client, ["a", "b"])
    client.patch(f"{ITEM}/o1%2F0", json={"metadata": {"ok": True}})
    with db_engine.begin() as conn:  # as a process of an older release would move it
        conn.execute(sa.text("UPDATE labels SET state = 'picked' WHERE name = 'o1/1'"))
        conn.execute(sa.text("UPDATE labels SET due_at = now() WHERE name = 'o1'"))
    while run_spawns(app, limit=10):
        pass
    assert body(client.get(f"{ORDER}/o1"))["state"] == "done"
    listed = body(client.get(f"{ORDER}/o1/children"))
    assert [c["outcome"] for c in listed["children"]] == ["succeeded", "succeeded"]


def test_metrics_count_the_children_spawned_and_the_decisions(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config())
    app = metered_app(load_config([path]), db_engine)
    client = create_app(app).test_client()
    _spawned(app, client, [])
    _spawned_as(app, client, "o2", ["a", "b", "c"])
    samples = scrape(client)
    spawned = value(
        samples, "routemaster_children_spawned_total", state_machine="order", state="pick"
    )
    decided = value(
        samples, "routemaster_spawn_decisions_total", state_machine="order", state="pick"
    )
    assert (spawned, decided) == (3, 1)


def _spawned_as(app: App, client: FlaskClient, name: str, items: list[object]) -> None:
    assert client.post(f"{ORDER}/{name}", json={"metadata": {"items": items}}).status_code == 201
    while run_spawns(app, limit=10):
        pass
