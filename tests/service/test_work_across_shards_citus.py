"""Work that spans labels, on a Citus cluster with labels on every shard (SPEC F1).

Webhook deliveries shared by two worker processes, pull tasks claimed by two
clients over HTTP, retention, bulk commands and searches: each reaches the
labels of every shard, and no claim takes a label twice. Skipped unless
``ROUTEMASTER_TEST_CITUS_URL`` names a coordinator (tests/citus_cluster.py).
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.plumbing.database import distributed
from routemaster.service.bulk import BulkCommand, accept, get_job, run_batch
from routemaster.service.retention import prune
from routemaster.service.search import count_matches, listing_search, page_of_matches
from tests.api.tasks_support import CONFIG as TASKS_CONFIG
from tests.citus_cluster import (
    Cluster,
    names_on_every_shard,
    shards_holding,
    shards_of_labels,
)
from tests.serving import serving
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, Workers
from tests.worker.notify import notify_config

pytestmark = [pytest.mark.citus, pytest.mark.slow]

LABELS = 256  # enough names to reach each of the 32 shards (checked)

RETAINED = """
retention:
  history: 1h
state_machines:
  m:
    retention:
      finished: 3h
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: metadata.go = true
        next: done
      - gate: done
        exit_condition: false
"""


@pytest.fixture
def citus_url(citus_cluster: Cluster) -> str:
    return citus_cluster.url


@pytest.fixture
def citus_engine(citus_cluster: Cluster) -> sa.Engine:
    return citus_cluster.engine


def app_for(engine: sa.Engine, path: Path, yaml_text: str) -> App:
    path.write_text(yaml_text)
    return App(config=load_config([path]), db=engine)


def count(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def test_the_database_is_distributed(citus_engine: sa.Engine) -> None:
    assert distributed(citus_engine)
    assert shards_of_labels(citus_engine) > 2


def test_two_workers_deliver_the_labels_of_every_shard_each_once(
    citus_url: str, citus_engine: sa.Engine, stub: StubServer, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    app = app_for(citus_engine, path, notify_config().replace("{stub}", stub.url("")))
    names = names_on_every_shard(citus_engine, "l", LABELS)
    for name in names:
        stub.script(f"/hook/{name}", Reply(200, delay=0.01))
    workers = Workers(citus_url, path, tmp_path)
    try:
        for _ in range(2):
            workers.start(delivery_concurrency=4)
        workers.wait_started(timeout=120)
        machine = app.config.get_machine("m")
        for name in names:
            service.create_label(app, machine, name, {})
        wait_until(
            lambda: (
                count(citus_engine, "SELECT count(*) FROM labels WHERE state = 'done'") == LABELS
            ),
            workers.logs,
            timeout=180,
        )
    finally:
        workers.stop_all()
    paths = sorted(request.path for request in stub.received())
    assert paths == sorted(f"/hook/{name}" for name in names)  # each once
    assert shards_holding(citus_engine, "labels", "state = 'done'") == shards_of_labels(
        citus_engine
    )
    delivered_by = [log.count("delivered ") for log in workers.logs()]
    assert all(delivered_by), f"both workers took a share: {delivered_by}"
    assert not any("Traceback" in log for log in workers.logs())


def test_two_clients_claim_the_pull_tasks_of_every_shard_over_http_each_once(
    citus_url: str, citus_engine: sa.Engine, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.yaml"
    app = app_for(citus_engine, path, TASKS_CONFIG)
    names = names_on_every_shard(citus_engine, "t", LABELS)
    machine = app.config.get_machine("jobs")
    for name in names:
        service.create_label(app, machine, name, {})
    with serving(path, citus_url, "--workers", "2") as base:

        def claim_until_none_left(worker: str) -> list[tuple[str, str]]:
            taken: list[tuple[str, str]] = []
            while True:
                answer = requests.post(
                    f"{base}/tasks/claim", json={"worker": worker, "limit": 7}, timeout=30
                )
                assert answer.status_code == 200, answer.text
                tasks = answer.json()["tasks"]
                if not tasks:
                    return taken
                taken += [(task["label"], task["id"]) for task in tasks]

        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(claim_until_none_left, ["a", "b"])
        claimed = first + second
        assert sorted(label for label, _ in claimed) == sorted(names)  # each once, by either
        for _, task_id in claimed[:20]:  # a task id routes to its label's shard
            done = requests.post(f"{base}/tasks/{task_id}/complete", json={}, timeout=30)
            assert done.status_code == 200, done.text
    assert count(citus_engine, "SELECT count(*) FROM labels WHERE state = 'check'") == 20
    assert count(citus_engine, "SELECT count(*) FROM labels WHERE task_id IS NOT NULL") == (
        LABELS - 20
    )


def test_retention_prunes_and_deletes_on_every_shard(
    citus_engine: sa.Engine, tmp_path: Path
) -> None:
    clock = FakeClock(datetime.datetime.now(datetime.UTC))
    app = app_for(citus_engine, tmp_path / "config.yaml", RETAINED)
    app.clock = clock
    machine = app.config.get_machine("m")
    names = names_on_every_shard(citus_engine, "r", LABELS)
    for name in names:
        service.create_label(app, machine, name, {})
        service.update_metadata(app, machine, name, {"go": True})
    clock.advance(hours=4)
    while any(prune(app).rows.values()):
        pass
    # Each label's creation entry is pruned (its current entry kept), then every label,
    # finished for four hours, is deleted as DELETE would.
    assert count(citus_engine, "SELECT count(*) FROM labels WHERE NOT deleted") == 0
    assert count(citus_engine, "SELECT count(*) FROM history WHERE old_state IS NULL") == 0
    assert shards_holding(citus_engine, "labels", "deleted") == shards_of_labels(citus_engine)


def test_a_bulk_command_reaches_the_labels_of_every_shard(
    citus_engine: sa.Engine, tmp_path: Path
) -> None:
    app = app_for(citus_engine, tmp_path / "config.yaml", RETAINED)
    machine = app.config.get_machine("m")
    names = names_on_every_shard(citus_engine, "b", LABELS)
    for name in names:
        service.create_label(app, machine, name, {"n": 1})
    search = listing_search(app, machine, "metadata.n = 1")
    job, matched = accept(app, search, BulkCommand("move", "to the end", to="done"), expect=LABELS)
    assert matched == LABELS
    while run_batch(app, limit=50):
        pass
    job_now = get_job(app, job)
    assert job_now is not None and job_now.done == LABELS and job_now.finished_at is not None
    assert count(citus_engine, "SELECT count(*) FROM labels WHERE state = 'done'") == LABELS


def test_a_search_finds_the_labels_of_every_shard(citus_engine: sa.Engine, tmp_path: Path) -> None:
    app = app_for(citus_engine, tmp_path / "config.yaml", RETAINED)
    machine = app.config.get_machine("m")
    names = names_on_every_shard(citus_engine, "s", LABELS)
    for index, name in enumerate(names):
        service.create_label(app, machine, name, {"even": index % 2 == 0})
    search = listing_search(app, machine, "metadata.even = true")
    assert count_matches(app, search) == LABELS // 2
    found: list[str] = []
    after = ""
    while page := page_of_matches(app, search, after=after, limit=25):
        found += [name for name, _ in page]
        after = page[-1][0]
    assert found == sorted(names[::2], key=lambda name: name.encode())
