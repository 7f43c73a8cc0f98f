"""Errored labels, as the worker leaves them, listed and counted by the API."""

from __future__ import annotations

from typing import Any

from routemaster.app import App
from routemaster.web import create_app
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running
from tests.worker.test_worker_actions import CONFIG, enter_action, state_of

LABELS = "/state-machines/m/labels"


def _errored(app: App, names: list[str]) -> None:
    """Each label enters the action, whose receiver refuses it for good (410)."""
    with running(app):
        for name in names:
            enter_action(app, name)
        wait_until(lambda: all(state_of(app, name).errored for name in names), "labels errored")


def _json(response: Any) -> Any:
    assert response.mimetype == "application/json", response.data[:200]
    return response.get_json()


def test_errored_labels_are_listed_paged_and_counted(make_app: MakeApp, stub: StubServer) -> None:
    for name in ("e1", "e2", "e3"):
        stub.script(f"/hook/{name}", Reply(410))
    app = make_app(CONFIG)
    _errored(app, ["e1", "e2", "e3"])
    client = create_app(app).test_client()
    client.post(f"{LABELS}/fine", json={"metadata": {}})

    everything = _json(client.get(f"{LABELS}?errored=true"))
    assert [entry["name"] for entry in everything["labels"]] == ["e1", "e2", "e3"]
    assert {entry["state"] for entry in everything["labels"]} == {"notify"}

    first = _json(client.get(f"{LABELS}?errored=true&limit=2"))
    assert [entry["name"] for entry in first["labels"]] == ["e1", "e2"]
    assert "errored=true" in first["next"]
    second = _json(client.get(first["next"]))
    assert [entry["name"] for entry in second["labels"]] == ["e3"]
    assert "next" not in second

    assert _json(client.get(f"{LABELS}?errored=true&state=start"))["labels"] == []
    assert _json(client.get(f"{LABELS}?errored=false"))["labels"] != []

    described = _json(client.get("/state-machines/m"))
    assert described["errored_counts"] == {"notify": 3}
    assert described["label_counts"] == {"notify": 3, "start": 1}
    by_state = {state["name"]: (state["labels"], state["errored"]) for state in described["states"]}
    assert by_state == {"start": (1, 0), "notify": (3, 3), "done": (0, 0)}
    assert described["errored_labels"] == f"{LABELS}?errored=true"


def test_a_retried_label_leaves_the_errored_listing(make_app: MakeApp, stub: StubServer) -> None:
    stub.script("/hook/x", Reply(410), Reply(200))
    app = make_app(CONFIG)
    _errored(app, ["x"])
    client = create_app(app).test_client()
    assert client.post(f"{LABELS}/x/retry").status_code == 200
    assert _json(client.get(f"{LABELS}?errored=true"))["labels"] == []


def test_errored_must_be_a_boolean(make_app: MakeApp) -> None:
    client = create_app(make_app(CONFIG)).test_client()
    response = client.get(f"{LABELS}?errored=maybe")
    assert response.status_code == 400
    assert "errored" in _json(response)["message"]
