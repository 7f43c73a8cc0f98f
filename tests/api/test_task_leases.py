"""Leases set at each claim (SPEC E4): a percentile of recent durations, and at most once."""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.service.tasks import expire_leases
from tests.api.helpers import body
from tests.api.tasks_support import START, Client, MakeClient, claim, create, label, tasks_client
from tests.worker.conftest import FakeClock

PERCENTILE = """
state_machines:
  jobs:
    states:
      - action: process
        worker: {lease: {percentile: 90, min: 10s, max: 45s}}
        next: done
      - gate: done
        exit_condition: false
"""

AT_MOST_ONCE = """
state_machines:
  jobs:
    states:
      - action: charge
        worker: {lease: 30s, at_most_once: true}
        retry: {max_attempts: 5, initial_delay: 1s}
        next: done
      - gate: done
        exit_condition: false
"""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def make_client(tmp_path: Path, db_engine: sa.Engine) -> MakeClient:
    return tasks_client(tmp_path, db_engine)


def _lease_of(client: Client, name: str) -> dict[str, Any]:
    explained = body(client.get(f"/state-machines/jobs/labels/{name}/explain"))
    lease: dict[str, Any] = explained["task"]["lease"]
    return lease


def _probe(client: Client, name: str) -> dict[str, Any]:
    """The lease a claim sets now, as explain shows it (the probe is completed at once)."""
    create(client, "jobs", name)
    [task] = claim(client)
    assert task["label"] == name
    lease = _lease_of(client, name)
    assert client.post(f"/tasks/{task['id']}/complete").status_code == 200
    return lease


def _work(client: Client, clock: FakeClock, prefix: str, count: int, seconds: int) -> None:
    """``count`` labels claimed together, worked ``seconds`` (heartbeating), completed."""
    for index in range(count):
        create(client, "jobs", f"{prefix}{index}")
    tasks = claim(client, limit=count)
    assert len(tasks) == count
    left = seconds
    while left > 0:
        step = min(left, 9)  # within the shortest lease (min: 10s)
        clock.advance(seconds=step)
        left -= step
        if left:
            for task in tasks:
                assert client.post(f"/tasks/{task['id']}/heartbeat").status_code == 200
    done = client.post("/tasks/complete", json={"tasks": [{"id": t["id"]} for t in tasks]})
    assert [entry["status"] for entry in body(done)["completed"]] == [200] * count


def test_a_percentile_lease_follows_the_durations_of_the_latest_completions(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, _ = make_client(clock, PERCENTILE)
    create(client, "jobs", "first")
    [task] = claim(client)
    assert _lease_of(client, "first") == {"seconds": 10, "source": "min", "samples": 0}
    expires = datetime.datetime.fromisoformat(task["lease_expires_at"])
    assert expires == START + datetime.timedelta(seconds=10)
    client.post(f"/tasks/{task['id']}/complete")

    _work(client, clock, "a", 18, 30)  # 19 completions: still too few to trust
    assert _probe(client, "probe1") == {"seconds": 10, "source": "min", "samples": 19}

    _work(client, clock, "b", 20, 30)  # 40 completions: 38 took 30 s, the probes none
    create(client, "jobs", "held")
    [task] = claim(client)
    assert _lease_of(client, "held") == {"seconds": 30, "source": "percentile", "samples": 40}
    expires = datetime.datetime.fromisoformat(task["lease_expires_at"])
    assert expires == clock() + datetime.timedelta(seconds=30)
    clock.advance(seconds=3)
    client.post(f"/tasks/{task['id']}/complete")

    _work(client, clock, "c", 40, 40)  # p90 of 81 is rank 73: among the 40 s ones
    assert _probe(client, "probe2") == {"seconds": 40, "source": "percentile", "samples": 81}

    _work(client, clock, "d", 30, 50)  # above max: clamped
    assert _probe(client, "probe3") == {"seconds": 45, "source": "max", "samples": 100}

    _work(client, clock, "e", 100, 12)  # only the last 100 count: the slow ones are gone
    assert _probe(client, "probe4") == {"seconds": 12, "source": "percentile", "samples": 100}


def test_failed_released_and_expired_tasks_do_not_count_as_completions(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, _ = make_client(clock, PERCENTILE)
    for index in range(25):
        create(client, "jobs", f"l{index}")
    tasks = claim(client, limit=25)
    clock.advance(seconds=5)
    for task in tasks[:10]:
        client.post(f"/tasks/{task['id']}/fail", json={"error": "x", "retry_after": 0})
    for task in tasks[10:20]:
        client.post(f"/tasks/{task['id']}/release")
    clock.advance(seconds=6)  # the other five run out
    create(client, "jobs", "probe")
    claim(client, limit=30)
    assert _lease_of(client, "probe") == {"seconds": 10, "source": "min", "samples": 0}


def test_an_at_most_once_lease_that_runs_out_errors_the_label_and_it_is_never_offered_again(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, app = make_client(clock, AT_MOST_ONCE)
    create(client, "jobs", "payment")
    [task] = claim(client)  # ... and the worker dies, maybe after charging the card
    explained = body(client.get("/state-machines/jobs/labels/payment/explain"))
    assert explained["worker"] == {"lease": 30, "at_most_once": True}
    clock.advance(seconds=31)
    assert claim(client, worker="w2") == []
    found = label(client, "jobs", "payment")
    assert found["errored"] is True
    assert found["state"] == "charge"
    history = body(client.get("/state-machines/jobs/labels/payment/history"))["history"]
    assert history[-1]["reason"] == "lease ran out (at most once)"
    explained = body(client.get("/state-machines/jobs/labels/payment/explain"))
    assert explained["last_error"] == "lease ran out (at most once)"
    late = client.post(f"/tasks/{task['id']}/complete", json={"metadata": {"charged": True}})
    assert (late.status_code, body(late)["reason"]) == (409, "lease_lost")
    for _ in range(3):  # long past any backoff `retry` would have allowed
        clock.advance(hours=1)
        expire_leases(app, random.Random(1))
        assert claim(client, worker="w3") == []
    assert label(client, "jobs", "payment")["errored"] is True


def test_an_at_most_once_lease_kept_alive_by_heartbeats_completes(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, _ = make_client(clock, AT_MOST_ONCE)
    create(client, "jobs", "payment")
    [task] = claim(client)
    for _ in range(3):
        clock.advance(seconds=20)
        assert client.post(f"/tasks/{task['id']}/heartbeat").status_code == 200
    done = client.post(f"/tasks/{task['id']}/complete")
    assert (done.status_code, body(done)["state"]) == (200, "done")
