"""``pause`` with ``{"until": ...}``: the label resumes by itself then (Metafora's sleep)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.service.bulk import run_batch
from tests.api.helpers import body
from tests.api.tasks_support import START, MakeClient, claim, create, tasks_client
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, running

UNTIL = "2026-11-24T13:00:00+00:00"


@pytest.fixture
def make_client(tmp_path: Path, db_engine: sa.Engine) -> MakeClient:
    return tasks_client(tmp_path, db_engine)


def test_a_label_paused_until_a_time_resumes_by_itself_then(make_client: MakeClient) -> None:
    clock = FakeClock(START)
    client, app = make_client(clock)
    create(client, "jobs", "a")
    paused = client.post("/state-machines/jobs/labels/a/pause", json={"until": UNTIL})
    assert paused.status_code == 200
    assert body(paused)["paused"]
    explained = body(client.get("/state-machines/jobs/labels/a/explain"))
    assert explained["paused_until"] == UNTIL
    assert claim(client) == []
    with running(app):
        clock.advance(minutes=59)
        assert service.resume_ended_pauses(app) == 0
        clock.advance(minutes=1)
        wait_until(
            lambda: not body(client.get("/state-machines/jobs/labels/a"))["paused"],
            "the label resumed",
            timeout=5,
        )
    [task] = claim(client)
    assert task["label"] == "a"
    reasons = [entry.reason for entry in service.history(app, app.config.get_machine("jobs"), "a")]
    assert reasons[-2:] == [f"paused until {UNTIL}", "resumed: the pause ended"]


def test_pausing_again_without_until_keeps_it_paused(make_client: MakeClient) -> None:
    clock = FakeClock(START)
    client, app = make_client(clock)
    create(client, "jobs", "a")
    client.post("/state-machines/jobs/labels/a/pause", json={"until": UNTIL})
    client.post("/state-machines/jobs/labels/a/pause")
    clock.advance(hours=2)
    assert service.resume_ended_pauses(app) == 0
    assert body(client.get("/state-machines/jobs/labels/a"))["paused"]


def test_a_pause_resumed_in_bulk_loses_its_end(make_client: MakeClient) -> None:
    """Paused again later (in bulk too), the label does not resume at the old time."""
    clock = FakeClock(START)
    client, app = make_client(clock)
    create(client, "jobs", "a")
    client.post("/state-machines/jobs/labels/a/pause", json={"until": UNTIL})
    for command in ("resume", "pause"):
        job = {"command": command, "prefix": "a", "expect": 1, "reason": "maintenance"}
        assert client.post("/state-machines/jobs/bulk", json=job).status_code == 202
        assert run_batch(app, limit=10) == 1  # as the worker loop runs it
    assert body(client.get("/state-machines/jobs/labels/a"))["paused"]
    clock.advance(hours=2)
    assert service.resume_ended_pauses(app) == 0
    assert body(client.get("/state-machines/jobs/labels/a"))["paused"]


@pytest.mark.parametrize(
    "until", ["tomorrow", "2026-11-24T13:00:00", "2026-11-24T11:00:00Z", 5, True]
)
def test_an_unusable_until_is_refused(make_client: MakeClient, until: object) -> None:
    client, _ = make_client(FakeClock(START))
    create(client, "jobs", "a")
    refused = client.post("/state-machines/jobs/labels/a/pause", json={"until": until})
    assert refused.status_code == 400
    assert "until" in body(refused)["message"]
    assert not body(client.get("/state-machines/jobs/labels/a"))["paused"]
