"""Every row of the REST table in SPEC A2, status code and JSON shape."""

from __future__ import annotations

from flask.testing import FlaskClient

from routemaster import __version__
from tests.api.helpers import body

LABELS = "/state-machines/user/labels"


def test_root_reports_ok_and_version(client: FlaskClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert body(response) == {
        "status": "ok",
        "state-machines": "/state-machines",
        "version": __version__,
    }


def test_state_machines_are_listed_with_their_label_links(client: FlaskClient) -> None:
    response = client.get("/state-machines")
    assert response.status_code == 200
    assert body(response) == {
        "state-machines": [
            {"name": "user", "labels": "/state-machines/user/labels"},
            {"name": "empty", "labels": "/state-machines/empty/labels"},
        ]
    }


def test_labels_listing_has_the_reference_shape_and_leaves_out_deleted(
    client: FlaskClient,
) -> None:
    for name in ("b", "a", "gone"):
        assert client.post(f"{LABELS}/{name}", json={"metadata": {}}).status_code == 201
    assert client.delete(f"{LABELS}/gone").status_code == 204
    response = client.get(LABELS)
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert body(response) == {
        "labels": [{"name": "a", "state": "start"}, {"name": "b", "state": "start"}],
        "create": "/state-machines/user/labels/:name",
    }


def test_labels_listing_of_an_unknown_machine_is_404(client: FlaskClient) -> None:
    response = client.get("/state-machines/nope/labels")
    assert response.status_code == 404
    assert "nope" in body(response)["message"]


def test_create_starts_in_the_first_state(client: FlaskClient) -> None:
    response = client.post(f"{LABELS}/alice", json={"metadata": {"a": 1}})
    assert response.status_code == 201
    assert body(response)["metadata"] == {"a": 1}
    assert body(response)["state"] == "start"


def test_create_rejects_bad_bodies_with_400(client: FlaskClient) -> None:
    bad: list[object] = [
        [],
        "text",
        3,
        None,
        {},
        {"metadata": []},
        {"metadata": "x"},
        {"metadata": None},
    ]
    for sent in bad:
        response = client.post(f"{LABELS}/alice", json=sent)
        assert response.status_code == 400, sent
        assert body(response)["message"]
    assert client.get(f"{LABELS}/alice").status_code == 404


def test_create_in_an_unknown_machine_is_404(client: FlaskClient) -> None:
    response = client.post("/state-machines/nope/labels/alice", json={"metadata": {}})
    assert response.status_code == 404


def test_create_twice_is_409_also_after_deletion(client: FlaskClient) -> None:
    assert client.post(f"{LABELS}/alice", json={"metadata": {}}).status_code == 201
    again = client.post(f"{LABELS}/alice", json={"metadata": {}})
    assert again.status_code == 409
    assert "alice" in body(again)["message"]
    client.delete(f"{LABELS}/alice")
    assert client.post(f"{LABELS}/alice", json={"metadata": {}}).status_code == 409


def test_get_returns_metadata_and_state(client: FlaskClient) -> None:
    client.post(f"{LABELS}/alice", json={"metadata": {"a": {"b": [1, 2]}}})
    response = client.get(f"{LABELS}/alice")
    assert response.status_code == 200
    assert body(response)["metadata"] == {"a": {"b": [1, 2]}}
    assert body(response)["state"] == "start"


def test_get_unknown_machine_or_label_is_404_and_deleted_is_410(client: FlaskClient) -> None:
    assert client.get("/state-machines/nope/labels/alice").status_code == 404
    assert client.get(f"{LABELS}/alice").status_code == 404
    client.post(f"{LABELS}/alice", json={"metadata": {}})
    client.delete(f"{LABELS}/alice")
    response = client.get(f"{LABELS}/alice")
    assert response.status_code == 410
    assert body(response)["message"]


def test_patch_deep_merges(client: FlaskClient) -> None:
    client.post(
        f"{LABELS}/alice",
        json={"metadata": {"nested": {"keep": 1, "change": 1}, "list": [1, 2], "gone": 1}},
    )
    response = client.patch(
        f"{LABELS}/alice",
        json={"metadata": {"nested": {"change": 2, "new": 3}, "list": [3], "gone": None}},
    )
    assert response.status_code == 200
    assert body(response)["metadata"] == {
        "nested": {"keep": 1, "change": 2, "new": 3},
        "list": [3],
        "gone": None,
    }
    assert body(response)["state"] == "start"


def test_patch_errors(client: FlaskClient) -> None:
    assert client.patch("/state-machines/nope/labels/a", json={"metadata": {}}).status_code == 404
    assert client.patch(f"{LABELS}/alice", json={"metadata": {}}).status_code == 404
    client.post(f"{LABELS}/alice", json={"metadata": {}})
    assert client.patch(f"{LABELS}/alice", json={"nometadata": {}}).status_code == 400
    assert client.patch(f"{LABELS}/alice", json={"metadata": [1]}).status_code == 400
    client.delete(f"{LABELS}/alice")
    assert client.patch(f"{LABELS}/alice", json={"metadata": {}}).status_code == 410


def test_patch_through_a_metadata_trigger_moves_the_label_in_the_same_request(
    client: FlaskClient,
) -> None:
    client.post(f"{LABELS}/alice", json={"metadata": {}})
    response = client.patch(f"{LABELS}/alice", json={"metadata": {"ready": True}})
    assert body(response)["state"] == "review"
    response = client.patch(f"{LABELS}/alice", json={"metadata": {"approved": True}})
    assert body(response)["state"] == "notify"
    assert body(client.get(f"{LABELS}/alice"))["state"] == "notify"


def test_create_does_not_evaluate_a_first_state_without_an_entry_trigger(
    client: FlaskClient,
) -> None:
    """As in 1.x: metadata given at creation fires no metadata trigger."""
    response = client.post(f"{LABELS}/bob", json={"metadata": {"ready": True, "approved": True}})
    assert response.status_code == 201
    assert body(response)["state"] == "start"
    # The next update that fires the trigger moves it through the entry-triggered gate.
    assert body(client.patch(f"{LABELS}/bob", json={"metadata": {"ready": True}}))["state"] == (
        "notify"
    )


def test_delete_is_204_whether_or_not_the_label_exists(client: FlaskClient) -> None:
    assert client.delete(f"{LABELS}/never").status_code == 204
    client.post(f"{LABELS}/alice", json={"metadata": {"a": 1}})
    response = client.delete(f"{LABELS}/alice")
    assert response.status_code == 204
    assert response.data == b""
    assert client.delete(f"{LABELS}/alice").status_code == 204


def test_delete_in_an_unknown_machine_is_404(client: FlaskClient) -> None:
    assert client.delete("/state-machines/nope/labels/alice").status_code == 404
