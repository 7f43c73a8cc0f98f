"""Bulk commands: dry runs, the safety checks, and the job the workers carry out.

The workers' part is :func:`routemaster.service.bulk.run_batch`, called here
as the worker loop calls it each round.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster import service
from routemaster.app import App
from routemaster.metrics import Metrics
from routemaster.service.bulk import run_batch
from tests.api.helpers import body
from tests.auth.test_auth import Bearer, bearer, secured
from tests.waiting import wait_until

__all__ = ["bearer", "secured"]  # fixtures shared with the authentication tests

LABELS = "/state-machines/user/labels"
BULK = "/state-machines/user/bulk"


def _create(client: FlaskClient, count: int, **metadata: Any) -> list[str]:
    names = [f"u{index:03}" for index in range(count)]
    for index, name in enumerate(names):
        response = client.post(f"{LABELS}/{name}", json={"metadata": {"n": index, **metadata}})
        assert response.status_code == 201
    return names


def _history(client: FlaskClient, name: str) -> list[dict[str, Any]]:
    return body(client.get(f"{LABELS}/{name}/history"))["history"]  # type: ignore[no-any-return]


def _error(app: App, names: list[str]) -> None:
    with app.db.begin() as conn:  # what the worker writes when a delivery gives up
        conn.execute(
            sa.text("UPDATE labels SET errored = true, due_at = NULL WHERE name = ANY(:names)"),
            {"names": names},
        )


def _finish(app: App, job: int, client: FlaskClient) -> dict[str, Any]:
    for _ in range(100):
        if run_batch(app, limit=7) == 0:
            break
    progress: dict[str, Any] = body(client.get(f"/bulk/{job}"))
    return progress


def test_a_dry_run_counts_and_samples_without_changing_anything(client: FlaskClient) -> None:
    _create(client, 30)
    response = client.post(
        BULK, json={"command": "pause", "where": "metadata.n >= 5", "reason": "x", "dry_run": True}
    )
    assert response.status_code == 200
    answer = body(response)
    assert answer["count"] == 25
    assert answer["sample"] == [f"u{index:03}" for index in range(5, 25)]
    assert body(client.get(f"{LABELS}/u010"))["paused"] is False


def test_a_real_run_needs_a_filter_and_expect(client: FlaskClient) -> None:
    _create(client, 3)
    no_filter = client.post(BULK, json={"command": "pause", "reason": "x", "expect": 3})
    assert no_filter.status_code == 400
    assert "filter" in body(no_filter)["message"]
    no_expect = client.post(BULK, json={"command": "pause", "reason": "x", "state": "start"})
    assert no_expect.status_code == 400
    assert "expect" in body(no_expect)["message"]
    no_reason = client.post(BULK, json={"command": "pause", "state": "start", "expect": 3})
    assert no_reason.status_code == 400
    bad = client.post(
        BULK, json={"command": "pause", "where": "metadata.n ==", "reason": "x", "expect": 3}
    )
    assert bad.status_code == 400
    assert "Error on line 1" in body(bad)["message"]


def test_an_expect_mismatch_is_409_with_the_count_and_does_nothing(
    client: FlaskClient, app: App
) -> None:
    _create(client, 4)
    response = client.post(
        BULK, json={"command": "pause", "state": "start", "reason": "x", "expect": 3}
    )
    assert response.status_code == 409
    assert body(response)["reason"] == "count_mismatch"
    assert body(response)["count"] == 4
    with app.db.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM bulk_jobs")).scalar_one() == 0
    assert run_batch(app, limit=10) == 0
    assert body(client.get(f"{LABELS}/u000"))["paused"] is False


def test_bulk_retry_of_errored_labels_records_each_as_forced_with_the_reason(
    client: FlaskClient, app: App
) -> None:
    names = _create(client, 20)
    _error(app, names[:12])
    request = {"command": "retry", "errored": True, "reason": "payment service back"}
    assert body(client.post(BULK, json={**request, "dry_run": True}))["count"] == 12
    accepted = client.post(BULK, json={**request, "expect": 12})
    assert accepted.status_code == 202
    job = body(accepted)
    assert job["count"] == 12
    client.post(f"{LABELS}/u003/retry")  # retried by hand meanwhile: no longer qualifies
    progress = _finish(app, job["id"], client)
    assert progress == {
        "id": job["id"],
        "command": "retry",
        "state_machine": "user",
        "total": 12,
        "done": 11,
        "skipped": 1,
        "failed": 0,
        "state": "finished",
    }
    for name in names[:12]:
        assert body(client.get(f"{LABELS}/{name}"))["errored"] is False
        reasons = [entry["reason"] for entry in _history(client, name) if entry["forced"]]
        assert reasons == (["retried"] if name == "u003" else ["payment service back"])
    assert all(entry["forced"] is False for entry in _history(client, "u015"))


def test_the_set_of_labels_is_fixed_when_accepted_and_each_is_checked_again(
    client: FlaskClient, app: App
) -> None:
    _create(client, 6)
    accepted = client.post(
        BULK, json={"command": "pause", "where": "metadata.n < 4", "reason": "hold", "expect": 4}
    )
    job = body(accepted)["id"]
    client.patch(f"{LABELS}/u001", json={"metadata": {"n": 100}})  # no longer matches
    _create_more = client.post(f"{LABELS}/late", json={"metadata": {"n": 0}})  # matches, late
    assert _create_more.status_code == 201
    progress = _finish(app, job, client)
    assert (progress["total"], progress["done"], progress["skipped"]) == (4, 3, 1)
    paused = {n: body(client.get(f"{LABELS}/{n}"))["paused"] for n in ("u000", "u001", "late")}
    assert paused == {"u000": True, "u001": False, "late": False}


def test_bulk_resume_of_paused_labels_and_bulk_move(client: FlaskClient, app: App) -> None:
    names = _create(client, 5)
    for name in names[:3]:
        client.post(f"{LABELS}/{name}/pause")
    resume = {"command": "resume", "where": "metadata.n >= 0", "reason": "incident over"}
    assert body(client.post(BULK, json={**resume, "dry_run": True}))["count"] == 5
    job = body(client.post(BULK, json={**resume, "expect": 5}))["id"]
    progress = _finish(app, job, client)
    assert (progress["done"], progress["skipped"]) == (3, 2)  # two were not paused
    assert not any(body(client.get(f"{LABELS}/{n}"))["paused"] for n in names)
    move = {"command": "move", "to": "done", "prefix": "u00", "reason": "closing", "expect": 5}
    job = body(client.post(BULK, json=move))["id"]
    assert _finish(app, job, client)["done"] == 5
    last = _history(client, "u004")[-1]
    assert (last["new_state"], last["forced"], last["reason"]) == ("done", True, "closing")


def test_a_bulk_pause_with_until_pauses_each_label_until_then(
    client: FlaskClient, app: App
) -> None:
    names = _create(client, 4)
    until = (app.now() + datetime.timedelta(seconds=3)).isoformat()
    pause = {"command": "pause", "where": "metadata.n < 3", "reason": "window", "until": until}
    job = body(client.post(BULK, json={**pause, "expect": 3}))["id"]
    progress = _finish(app, job, client)
    assert (progress["done"], progress["until"]) == (3, until)
    paused = [name for name in names if body(client.get(f"{LABELS}/{name}"))["paused"]]
    assert paused == names[:3]
    assert body(client.get(f"{LABELS}/u000/explain"))["paused_until"] == until

    def resumed() -> bool:
        service.resume_ended_pauses(app)  # as the worker loop calls it each round
        return not any(body(client.get(f"{LABELS}/{name}"))["paused"] for name in names)

    wait_until(resumed, "the paused labels resumed by themselves", timeout=10)
    reasons = [entry["reason"] for entry in _history(client, "u002")]
    assert reasons[-2:] == ["window", "resumed: the pause ended"]


def test_a_bulk_job_without_until_shows_none(client: FlaskClient, app: App) -> None:
    _create(client, 1)
    pause = {"command": "pause", "prefix": "u", "reason": "x", "expect": 1}
    assert "until" not in _finish(app, body(client.post(BULK, json=pause))["id"], client)


@pytest.mark.parametrize(
    ("command", "until", "problem"),
    [
        ("resume", "2099-01-01T00:00:00Z", "for pause only"),
        ("retry", "2099-01-01T00:00:00Z", "for pause only"),
        ("pause", "tomorrow", "ISO-8601"),
        ("pause", "2099-01-01T00:00:00", "ISO-8601"),
        ("pause", 5, "ISO-8601"),
        ("pause", "2000-01-01T00:00:00Z", "in the future"),
    ],
)
def test_an_unusable_bulk_until_is_400(
    client: FlaskClient, command: str, until: object, problem: str
) -> None:
    _create(client, 1)
    job = {"command": command, "prefix": "u", "reason": "x", "until": until}
    for extra in ({"dry_run": True}, {"expect": 1}):
        refused = client.post(BULK, json={**job, **extra})
        assert refused.status_code == 400
        assert problem in body(refused)["message"]
    assert body(client.get(f"{LABELS}/u000"))["paused"] is False


def test_bulk_delete_and_the_move_destination_is_checked(client: FlaskClient, app: App) -> None:
    _create(client, 3)
    nowhere = {"command": "move", "to": "nowhere", "state": "start", "reason": "x", "expect": 3}
    assert client.post(BULK, json=nowhere).status_code == 400
    delete = {"command": "delete", "where": "metadata.n = 1", "reason": "gdpr", "expect": 1}
    job = body(client.post(BULK, json=delete))["id"]
    assert _finish(app, job, client)["done"] == 1
    assert client.get(f"{LABELS}/u001").status_code == 410
    assert [entry["reason"] for entry in _history(client, "u001")][-2:] == ["gdpr", "deleted"]


def test_an_unknown_job_is_404(client: FlaskClient) -> None:
    assert client.get("/bulk/12345").status_code == 404


def test_bulk_outcomes_are_counted_in_the_metrics(client: FlaskClient, app: App) -> None:
    app.metrics = Metrics()
    _create(client, 3)
    client.post(f"{LABELS}/u000/pause")
    resume = {"command": "resume", "state": "start", "reason": "go", "expect": 3}
    _finish(app, body(client.post(BULK, json=resume))["id"], client)
    registry = app.metrics.registry()
    for outcome, count in (("done", 1), ("skipped", 2)):
        labels = {"state_machine": "user", "command": "resume", "outcome": outcome}
        assert registry.get_sample_value("routemaster_bulk_labels_total", labels) == count


def test_bulk_needs_operate_and_delete_needs_write_too(
    secured: flask.Flask, bearer: Bearer
) -> None:
    client = secured.test_client()
    writer = bearer("read", "write")
    client.post(f"{LABELS}/ann", json={"metadata": {}}, headers=writer)
    delete = {"command": "delete", "state": "start", "reason": "x", "dry_run": True}
    assert client.post(BULK, json=delete, headers=writer).status_code == 403
    operator = bearer("read", "operate")
    refused = client.post(BULK, json=delete, headers=operator)
    assert refused.status_code == 403
    assert "write" in body(refused)["message"]
    pause = {"command": "pause", "state": "start", "reason": "x", "dry_run": True}
    assert body(client.post(BULK, json=pause, headers=operator))["count"] == 1
    both = bearer("read", "write", "operate")
    assert body(client.post(BULK, json=delete, headers=both))["count"] == 1


def test_a_label_whose_change_fails_is_counted_failed_and_the_others_done(
    client: FlaskClient, app: App
) -> None:
    _create(client, 5)
    refuse = (
        "CREATE FUNCTION refuse_u002() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.label = 'u002' AND NEW.forced THEN RAISE EXCEPTION 'refused'; END IF;"
        " RETURN NEW; END $$;"
        " CREATE TRIGGER refuse_u002 BEFORE INSERT ON history"
        " FOR EACH ROW EXECUTE FUNCTION refuse_u002()"
    )
    with app.db.begin() as conn:
        conn.exec_driver_sql(refuse)
    try:
        pause = {"command": "pause", "state": "start", "reason": "hold", "expect": 5}
        progress = _finish(app, body(client.post(BULK, json=pause))["id"], client)
    finally:
        with app.db.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER refuse_u002 ON history; DROP FUNCTION refuse_u002()")
    assert (progress["done"], progress["failed"], progress["state"]) == (4, 1, "finished")
    paused = [body(client.get(f"{LABELS}/u{i:03}"))["paused"] for i in range(5)]
    assert paused == [True, True, False, True, True]


def test_a_job_whose_machine_left_the_configuration_fails_its_labels(
    client: FlaskClient, app: App
) -> None:
    _create(client, 2)
    job = body(
        client.post(BULK, json={"command": "pause", "state": "start", "reason": "x", "expect": 2})
    )
    without = dataclasses.replace(app.config, state_machines=(app.config.get_machine("empty"),))
    later = App(config=without, db=app.db)
    while run_batch(later, limit=10):
        pass
    progress = body(client.get(f"/bulk/{job['id']}"))
    assert (progress["failed"], progress["done"], progress["state"]) == (2, 0, "finished")
