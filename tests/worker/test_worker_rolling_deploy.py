"""A rolling deploy: a worker on the previous configuration and one on the new, at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from tests.serving import stop_all
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import worker_environment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

OLD = """
state_machines:
  m:
    states:
      - gate: waiting
        triggers: [{metadata: go}]
        exit_condition: metadata.go
        next: ping
      - action: ping
        webhook: "{stub}/ping/<label>"
        next: done
      - gate: done
        exit_condition: false
"""

NEW = """
state_machines:
  m:
    states:
      - gate: waiting
        triggers: [{metadata: go}]
        exit_condition: metadata.go
        next: notify
      - action: notify
        webhook: "{stub}/ping/<label>"
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - rename: {from: ping, to: notify}
"""


class Crons:
    """``routemaster -c CONFIG cron`` processes, each logging to its own file."""

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.database_url = database_url
        self.tmp_path = tmp_path
        self.processes: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, config: Path, **settings: str) -> Path:
        log = self.tmp_path / f"cron{len(self.processes)}.log"
        env = worker_environment(self.database_url, **{"migrations_interval": 0.3, **settings})
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "routemaster", "-c", str(config), "cron"],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.processes.append((process, log))
        wait_until(lambda: "started" in log.read_text(), f"{log} did not start", timeout=30)
        return log

    def alive(self) -> bool:
        return all(process.poll() is None for process, _ in self.processes)

    def stop(self) -> None:
        stop_all((process for process, _ in self.processes), timeout=15)


@pytest.fixture
def crons(database_url: str, tmp_path: Path) -> Iterator[Crons]:
    started = Crons(database_url, tmp_path)
    yield started
    started.stop()


def _states(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT state, count(*) FROM labels GROUP BY state")).all()
    return {state: count for state, count in rows}


def test_old_and_new_workers_share_the_labels_and_each_webhook_goes_once(
    tmp_path: Path, db_engine: sa.Engine, stub: StubServer, crons: Crons
) -> None:
    old_config = tmp_path / "old.yaml"
    old_config.write_text(OLD.replace("{stub}", stub.url("")))
    new_config = tmp_path / "new.yaml"
    new_config.write_text(NEW.replace("{stub}", stub.url("")))
    old_api = App(config=load_config([old_config]), db=db_engine)  # a process not yet replaced
    machine = old_api.config.get_machine("m")
    names = [f"l{index}" for index in range(40)]
    for name in names:
        stub.script(f"/ping/{name}", Reply(200, delay=0.1))
        service.create_label(old_api, machine, name, {})
    old_log = crons.start(old_config, delivery_concurrency="1")
    new_log = crons.start(new_config)
    for name in names:  # the old process moves labels into the state the new one renamed
        service.update_metadata(old_api, machine, name, {"go": True})
    wait_until(lambda: _states(db_engine) == {"done": 40}, f"{_states(db_engine)}", timeout=60)
    assert crons.alive(), (old_log.read_text(), new_log.read_text())
    assert sorted(request.path for request in stub.received()) == sorted(
        f"/ping/{name}" for name in names
    )  # once each, whichever worker sent it
    logs = old_log.read_text() + new_log.read_text()
    assert "Traceback" not in logs
    with db_engine.connect() as conn:
        versions = conn.execute(
            sa.text("SELECT DISTINCT version FROM history WHERE new_state = 'done'")
        ).scalars()
        assert set(versions) <= {1, 2}
        renamed = conn.execute(
            sa.text(
                "SELECT count(*) FROM history WHERE reason = 'migration: rename ping -> notify'"
            )
        ).scalar_one()
    assert renamed > 0  # the slow old worker left some to the new one
