"""Behind PgBouncer in transaction mode with 5 server connections, and no direct URL (SPEC E3).

Two ``serve`` processes on two versions of a machine and a ``cron`` on a
third share the pooler: every history entry carries the version of the
process that wrote it; a statement cut off by the timeout answers 504 JSON;
a waiting claim is woken by polling; a revoked token stops working within
the poll interval. PgBouncer runs with its default settings, so it refuses
the startup parameter ``options``: nothing may rely on one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from routemaster.api.tasks import claim_waiter
from routemaster.app import App, Settings
from routemaster.auth.admin import create_token
from routemaster.config import load_config
from routemaster.db.plumbing.database import create_engine
from routemaster.web import create_app
from tests.pooler import running_pgbouncer
from tests.serving import REPOSITORY, serve_process, stop
from tests.stub_server import StubServer
from tests.waiting import wait_until

POLL = 0.5  # ROUTEMASTER_POLL_INTERVAL of every process here: the wake-up bound
SLACK = 1.0  # seconds allowed beyond the bound for a request and a busy machine

MACHINE = """
state_machines:
  flow:
    states:
      - gate: start
        triggers:
          - metadata: step
        exit_condition: metadata.step >= {first}
        next: middle
      - gate: middle
        triggers:
          - metadata: step
        exit_condition: metadata.step >= 2
        next: notify
      - action: notify
        webhook: {stub}/hooks/<label>
        next: end
      - gate: end
        exit_condition: false
  jobs:
    states:
      - action: work
        worker: {{lease: 30s}}
        next: done
      - gate: done
        exit_condition: false
"""


def _config(tmp_path: Path, stub: StubServer, name: str, first: int, extra: str = "") -> Path:
    """A version of the machines: ``first`` makes each a distinct definition (1 >= 1 ...)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(MACHINE.format(first=first, stub=stub.url("")) + extra)
    return path


def _no_direct(**settings: object) -> dict[str, str]:
    """The environment of a process given only the pooler: no direct URL at all."""
    return {
        "ROUTEMASTER_DIRECT_DATABASE_URL": "",
        "ROUTEMASTER_POLL_INTERVAL": str(POLL),
        **{f"ROUTEMASTER_{name.upper()}": str(value) for name, value in settings.items()},
    }


@pytest.fixture
def pooler(direct_database_url: str, db_engine: sa.Engine) -> Iterator[str]:
    """PgBouncer in transaction mode, 5 server connections, default settings."""
    with running_pgbouncer(direct_database_url, pool_size=5) as url:
        yield url


@pytest.fixture
def direct(direct_database_url: str, db_engine: sa.Engine) -> Iterator[sa.Engine]:
    """The database itself, for the test's own checks (never given to the processes)."""
    engine = create_engine(direct_database_url)
    yield engine
    engine.dispose()


@contextlib.contextmanager
def _cron(config: Path, url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    environment = {**_environment(), **_no_direct(), "DATABASE_URL": url}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "routemaster", "-c", str(config), "cron"],
            cwd=REPOSITORY,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        stop(process)


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("DB_")}


def _latest_version(direct: sa.Engine) -> int:
    with direct.connect() as conn:
        found = conn.execute(
            sa.text("SELECT max(version) FROM machine_versions WHERE machine = 'flow'")
        ).scalar()
    assert found is not None
    return int(found)


def test_each_history_entry_carries_the_version_of_the_process_that_wrote_it(
    pooler: str, direct: sa.Engine, stub: StubServer, tmp_path: Path
) -> None:
    configs = [_config(tmp_path, stub, name, first) for name, first in (("a", 1), ("b", 0))]
    cron_config = _config(tmp_path, stub, "cron", -1)
    with contextlib.ExitStack() as stack:
        bases, versions = [], []
        for config in configs:
            _, base = stack.enter_context(serve_process(config, pooler, env=_no_direct()))
            bases.append(base)
            versions.append(_latest_version(direct))
        cron = stack.enter_context(_cron(cron_config, pooler, tmp_path / "cron.log"))
        wait_until(lambda: _latest_version(direct) == 3, "the cron's version recorded", timeout=30)
        assert cron.poll() is None
        cron_version = 3

        def drive(job: tuple[int, int]) -> None:
            which, i = job
            label = f"{bases[which]}/state-machines/flow/labels/{'ab'[which]}{i}"
            with requests.Session() as session:
                assert session.post(label, json={"metadata": {}}).status_code == 201
                for step in (1, 2):
                    answer = session.patch(label, json={"metadata": {"step": step}})
                    assert answer.status_code == 200, answer.text

        jobs = [(which, i) for i in range(40) for which in (0, 1)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(drive, jobs))

        def delivered() -> bool:
            with direct.connect() as conn:
                ended = conn.execute(sa.text("SELECT count(*) FROM labels WHERE state = 'end'"))
                return ended.scalar() == 80

        wait_until(delivered, "every label delivered by the cron and moved on", timeout=60)
    with direct.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT label, old_state, new_state, version FROM history ORDER BY id")
        ).all()
    assert len(rows) == 320  # per label: created, start -> middle -> notify, notify -> end
    wrong = [
        row
        for row in rows
        if row.version
        != (cron_version if row.old_state == "notify" else versions["ab".index(row.label[0])])
    ]
    assert versions == [1, 2]
    assert wrong == [], f"{len(wrong)} of 320 entries stamped with another version"


def test_a_statement_waiting_on_a_row_lock_answers_504_json_at_the_timeout(
    pooler: str, direct: sa.Engine, stub: StubServer, tmp_path: Path
) -> None:
    config = _config(tmp_path, stub, "a", 1)
    with serve_process(config, pooler, env=_no_direct(statement_timeout=1)) as (_, base):
        label = f"{base}/state-machines/flow/labels/held"
        assert requests.post(label, json={"metadata": {}}, timeout=10).status_code == 201
        with direct.begin() as holder:
            holder.execute(sa.text("SELECT 1 FROM labels WHERE name = 'held' FOR UPDATE"))
            started = time.monotonic()
            answer = requests.patch(label, json={"metadata": {"x": 1}}, timeout=30)
            took = time.monotonic() - started
        assert answer.status_code == 504
        assert answer.headers["Content-Type"].startswith("application/json")
        assert "statement timeout (1 s)" in answer.json()["message"]
        assert 1.0 <= took < 15.0  # cut at the timeout, not held for the lock (30 s)
        # The pooled server connection carries no timeout to whoever uses it next.
        assert requests.patch(label, json={"metadata": {"x": 2}}, timeout=10).status_code == 200


def test_a_waiting_claim_is_woken_within_the_poll_interval(
    pooler: str, stub: StubServer, tmp_path: Path
) -> None:
    config = _config(tmp_path, stub, "a", 1)
    engine = create_engine(pooler)
    app = App(config=load_config([config]), db=engine, settings=Settings(poll_interval=POLL))
    flask_app = create_app(app)  # the claims' process: polls, as it has no direct URL
    client = flask_app.test_client()
    answer: dict[str, Any] = {}

    def claim() -> None:
        response = client.post("/tasks/claim", json={"worker": "w", "wait": 20})
        answer["tasks"] = response.get_json()["tasks"]
        answer["at"] = time.monotonic()

    try:
        with serve_process(config, pooler, env=_no_direct()) as (_, base):
            thread = threading.Thread(target=claim)
            thread.start()
            wait_until(lambda: claim_waiter(flask_app).waiting == 1, "the claim waiting")
            created = requests.post(f"{base}/state-machines/jobs/labels/j1", json={"metadata": {}})
            entered = time.monotonic()
            assert created.status_code == 201
            thread.join(timeout=20)
        assert [task["label"] for task in answer["tasks"]] == ["j1"]
        assert answer["at"] - entered < POLL + SLACK
    finally:
        engine.dispose()


def test_a_revoked_token_stops_working_within_the_poll_interval(
    pooler: str, stub: StubServer, tmp_path: Path
) -> None:
    config = _config(tmp_path, stub, "a", 1, extra="api:\n  authentication: tokens\n")
    engine = create_engine(pooler)
    try:
        secret, confirmation = create_token(engine, "ci", {"read"})
        assert confirmation.polled  # nothing listens behind the pooler
        headers = {"Authorization": f"Bearer {secret.secret}"}
        with serve_process(config, pooler, env=_no_direct()) as (_, base):
            labels = f"{base}/state-machines/flow/labels"
            wait_until(
                lambda: requests.get(labels, headers=headers, timeout=10).status_code == 200,
                "the token accepted",
            )
            revoke = subprocess.run(
                [sys.executable, "-m", "routemaster", "-c", str(config), "token", "revoke", "ci"],
                cwd=REPOSITORY,
                env={**_environment(), **_no_direct(), "DATABASE_URL": pooler},
                capture_output=True,
                check=True,
            )
            revoked = time.monotonic()
            assert b"within their poll interval" in revoke.stderr
            wait_until(
                lambda: requests.get(labels, headers=headers, timeout=10).status_code == 401,
                "the token refused",
                timeout=POLL + SLACK,
            )
            assert time.monotonic() - revoked < POLL + SLACK
    finally:
        engine.dispose()
