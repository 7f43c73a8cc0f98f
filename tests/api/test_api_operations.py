"""Operator commands: retry, pause/resume and forced moves, each recorded in history."""

from __future__ import annotations

import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from tests.api.helpers import body

LABEL = "/state-machines/user/labels/ann"


def _history(client: FlaskClient) -> list[dict[str, object]]:
    return body(client.get(LABEL + "/history"))["history"]  # type: ignore[no-any-return]


def test_forced_move_puts_the_label_in_the_state_and_says_so_in_history(
    client: FlaskClient,
) -> None:
    client.post(LABEL, json={"metadata": {}})
    response = client.post(LABEL + "/move", json={"state": "done", "reason": "support ticket 12"})
    assert response.status_code == 200
    assert body(response)["state"] == "done"
    last = _history(client)[-1]
    assert (last["old_state"], last["new_state"]) == ("start", "done")
    assert last["forced"] is True
    assert last["reason"] == "support ticket 12"


def test_forced_move_to_an_unknown_state_is_409_and_leaves_the_label(client: FlaskClient) -> None:
    client.post(LABEL, json={"metadata": {}})
    response = client.post(LABEL + "/move", json={"state": "nowhere"})
    assert response.status_code == 409
    assert "nowhere" in body(response)["message"]
    assert body(client.get(LABEL))["state"] == "start"


def test_forced_move_needs_a_destination(client: FlaskClient) -> None:
    client.post(LABEL, json={"metadata": {}})
    response = client.post(LABEL + "/move", json={"reason": "no state"})
    assert response.status_code == 400
    assert "state" in body(response)["message"]


def test_a_paused_label_ignores_metadata_triggers_until_resumed(client: FlaskClient) -> None:
    client.post(LABEL, json={"metadata": {}})
    assert body(client.post(LABEL + "/pause"))["paused"] is True
    moved = client.patch(LABEL, json={"metadata": {"ready": True, "route": "fast"}})
    assert body(moved)["state"] == "start"
    resumed = client.post(LABEL + "/resume", json={"reason": "incident over"})
    assert body(resumed)["paused"] is False
    reasons = [entry["reason"] for entry in _history(client) if entry["forced"]]
    assert reasons == ["paused", "incident over"]


def test_retry_makes_an_errored_label_due_again(client: FlaskClient, app: App) -> None:
    client.post(LABEL, json={"metadata": {}})
    client.patch(LABEL, json={"metadata": {"ready": True}})
    client.patch(LABEL, json={"metadata": {"approved": True}})
    assert body(client.get(LABEL))["state"] == "notify"
    with app.db.begin() as conn:  # what the worker writes when attempts run out
        conn.execute(
            sa.text(
                "UPDATE labels SET errored = true, attempts = 10, due_at = NULL, "
                "last_error = 'HTTP 500' WHERE name = 'ann'"
            )
        )
    assert body(client.get(LABEL))["errored"] is True
    response = client.post(LABEL + "/retry")
    assert response.status_code == 200
    assert body(response)["errored"] is False
    with app.db.connect() as conn:
        attempts, due = conn.execute(
            sa.text("SELECT attempts, due_at IS NOT NULL FROM labels WHERE name = 'ann'")
        ).one()
    assert (attempts, due) == (0, True)


def test_retry_of_a_label_that_is_not_errored_is_409(client: FlaskClient) -> None:
    client.post(LABEL, json={"metadata": {}})
    response = client.post(LABEL + "/retry")
    assert response.status_code == 409
    assert "not errored" in body(response)["message"]


def test_commands_on_unknown_and_deleted_labels(client: FlaskClient) -> None:
    assert client.post(LABEL + "/pause").status_code == 404
    client.post(LABEL, json={"metadata": {}})
    client.delete(LABEL)
    assert client.post(LABEL + "/pause").status_code == 410
