"""Upgrade strategies (SPEC E4): continue, abort, bulk upgrade, and plan's labels per version.

Each "process" here is what ``serve`` or ``cron`` builds at start: the
configuration applied with ``routemaster migrate -c`` (the same code they
run), an engine whose history rows carry its versions, and an App that knows
which versions it runs. Old and new ones run side by side, as in a rolling
deploy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from werkzeug.test import TestResponse

from routemaster import service
from routemaster.app import App, Settings
from routemaster.cli import cli
from routemaster.cli.configuration import continuing
from routemaster.config import load_config
from routemaster.db import labels as store
from routemaster.db.history import stamp_versions
from routemaster.db.plumbing.database import create_engine
from routemaster.db.versions import last_applied
from routemaster.machine.definitions import LoadedVersions
from routemaster.service.bulk import run_batch
from routemaster.web import create_app
from tests.stub_server import StubServer
from tests.waiting import wait_until
from tests.worker.conftest import running

V1 = """
state_machines:
  m:
    upgrade_strategy: continue
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: metadata.go = 1
        next: ping
      - action: ping
        webhook: "{stub}/v1/<label>"
        next: done
      - gate: done
        exit_condition: false
"""

V2 = """
state_machines:
  m:
    upgrade_strategy: continue
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: metadata.go = 2
        next: notify
      - action: notify
        webhook: "{stub}/v2/<label>"
        next: finished
      - gate: finished
        exit_condition: false
    migrations:
      - rename: {from: ping, to: notify}
      - rename: {from: done, to: finished}
"""


class Deployment:
    """Processes started from configurations, each as ``serve``/``cron`` would build it."""

    def __init__(self, database_url: str, tmp_path: Path, stub: StubServer) -> None:
        self.database_url = database_url
        self.tmp_path = tmp_path
        self.stub = stub
        self.engines: list[sa.Engine] = []
        self.apps: list[App] = []

    def migrate(self, yaml_text: str) -> click.testing.Result:
        """``routemaster -c CONFIG migrate``: schema, versions, migrations, abort."""
        path = self.tmp_path / f"config{len(self.apps)}-{len(self.engines)}.yaml"
        path.write_text(yaml_text.replace("{stub}", self.stub.url("")))
        self.path = path
        env = {"DATABASE_URL": self.database_url, "DB_HOST": None, "DB_NAME": None}
        return CliRunner().invoke(cli, ["-c", str(path), "migrate"], env=env)

    def start(self, yaml_text: str) -> App:
        """A process of ``yaml_text``: applied first, as serve and cron do at start."""
        result = self.migrate(yaml_text)
        assert result.exit_code == 0, result.output
        config = load_config([self.path])
        reader = create_engine(self.database_url)
        with reader.connect() as conn:
            versions = {name: found.version for name, found in last_applied(conn).items()}
        reader.dispose()
        engine = create_engine(self.database_url)
        stamp_versions(engine, versions, continuing(config))
        self.engines.append(engine)
        app = App(
            config=config,
            db=engine,
            settings=Settings(poll_interval=0.2, worker_id=f"process-{len(self.apps)}"),
            versions=LoadedVersions(in_force=versions),
        )
        self.apps.append(app)
        return app

    def close(self) -> None:
        for app in self.apps:
            app.http.close()
        for engine in self.engines:
            engine.dispose()


@pytest.fixture
def deployment(
    database_url: str, db_engine: sa.Engine, tmp_path: Path, stub: StubServer
) -> Iterator[Deployment]:
    deployed = Deployment(database_url, tmp_path, stub)
    yield deployed
    deployed.close()


def _label(app: App, name: str) -> store.Label:
    with app.db.connect() as conn:
        found = store.get(conn, "m", name)
    assert found is not None
    return found


def _history(app: App, name: str) -> list[tuple[str | None, str | None, int | None]]:
    with app.db.connect() as conn:
        return [(e.old_state, e.new_state, e.version) for e in store.history(conn, "m", name)]


def _patch(app: App, name: str, metadata: dict[str, Any]) -> store.Label:
    return service.update_metadata(app, app.config.get_machine("m"), name, metadata)


def test_labels_of_two_versions_move_by_their_own_definitions_while_old_and_new_run(
    deployment: Deployment, stub: StubServer
) -> None:
    old = deployment.start(V1)
    for name in ("a1", "a2", "a3"):
        service.create_label(old, old.config.get_machine("m"), name, {})
    new = deployment.start(V2)  # not refused: a1..a3 keep version 1, which has their states
    for name in ("b1", "b2"):
        service.create_label(new, new.config.get_machine("m"), name, {})
    assert [_label(new, n).version for n in ("a1", "b1")] == [1, 2]

    with running(old), running(new):  # a rolling deploy: both versions' workers at once
        # An old label updated through a new process follows version 1's gate and action.
        assert _patch(new, "a1", {"go": 2}).state == "start"
        assert _patch(new, "a1", {"go": 1}).state == "ping"
        # A new label updated through an old process follows version 2's.
        assert _patch(old, "b1", {"go": 1}).state == "start"
        assert _patch(old, "b1", {"go": 2}).state == "notify"
        wait_until(lambda: _label(new, "a1").state == "done", "a1 finished under v1")
        wait_until(lambda: _label(new, "b1").state == "finished", "b1 finished under v2")
    assert sorted(r.path for r in stub.received()) == ["/v1/a1", "/v2/b1"]
    # Every entry carries the label's version, whichever process wrote it.
    assert _history(new, "a1") == [(None, "start", 1), ("start", "ping", 1), ("ping", "done", 1)]
    assert _history(new, "b1") == [
        (None, "start", 2),
        ("start", "notify", 2),
        ("notify", "finished", 2),
    ]

    # The old process is gone; a restarted new-configuration worker delivers version 1's
    # action (a state version 2 lacks) to version 1's URL, and nothing migrates a2.
    restarted = deployment.start(V2)
    assert _patch(restarted, "a2", {"go": 1}).state == "ping"
    with running(restarted):
        wait_until(lambda: _label(restarted, "a2").state == "done", "a2 finished under v1")
    assert sorted(r.path for r in stub.received()) == ["/v1/a1", "/v1/a2", "/v2/b1"]
    assert _label(restarted, "a3").version == 1


ABORT_V1 = """
state_machines:
  m:
    upgrade_strategy: abort
    abort_to: cancelled
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: metadata.go
        next: done
      - gate: cancelled
        exit_condition: false
      - gate: done
        exit_condition: false
"""


def test_abort_moves_older_versions_labels_when_a_new_version_is_applied(
    deployment: Deployment,
) -> None:
    old = deployment.start(ABORT_V1)
    for name in ("waiting", "finished"):
        service.create_label(old, old.config.get_machine("m"), name, {})
    _patch(old, "finished", {"go": True})
    # The same version started again aborts nothing.
    again = deployment.start(ABORT_V1)
    assert _label(again, "waiting").state == "start"

    new = deployment.start(ABORT_V1.replace("exit_condition: metadata.go", "exit_condition: true"))
    aborted = _label(new, "waiting")
    assert (aborted.state, aborted.version) == ("cancelled", 2)
    with new.db.connect() as conn:
        last = store.history(conn, "m", "waiting")[-1]
    assert (last.old_state, last.new_state, last.forced, last.reason, last.version) == (
        "start",
        "cancelled",
        True,
        "aborted: version 1 -> 2",
        2,
    )
    assert _label(new, "finished").state == "done"  # an end state is left alone
    service.create_label(new, new.config.get_machine("m"), "fresh", {})
    deployment.start(ABORT_V1.replace("exit_condition: metadata.go", "exit_condition: true"))
    assert _label(new, "fresh").state == "start"  # created under the version in force


def test_abort_needs_a_state_to_abort_to(deployment: Deployment) -> None:
    result = deployment.migrate(ABORT_V1.replace("    abort_to: cancelled\n", ""))
    assert result.exit_code == 1
    assert "state_machines.m.upgrade_strategy" in result.output
    result = deployment.migrate(ABORT_V1.replace("abort_to: cancelled", "abort_to: nowhere"))
    assert result.exit_code == 1
    assert "no state called 'nowhere'" in result.output


GATES_V1 = """
state_machines:
  m:
    upgrade_strategy: continue
    states:
      - gate: waiting
        triggers: [{metadata: go}]
        exit_condition: metadata.go
        next:
          type: context
          path: metadata.park
          default: done
          destinations: [{value: true, state: parked}]
      - gate: parked
        exit_condition: false
        next: done
      - gate: done
        exit_condition: false
  plain:
    states:
      - gate: only
        exit_condition: false
"""

GATES_V2 = """
state_machines:
  m:
    upgrade_strategy: continue
    states:
      - gate: holding
        triggers: [{metadata: go}]
        exit_condition: metadata.go
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - rename: {from: waiting, to: holding}
  plain:
    states:
      - gate: only
        exit_condition: false
"""


def test_bulk_upgrade_renames_through_the_migrations_and_fails_without_one(
    deployment: Deployment,
) -> None:
    old = deployment.start(GATES_V1)
    machine = old.config.get_machine("m")
    for name in ("u1", "u2", "u3"):
        service.create_label(old, machine, name, {"batch": 1})
    service.force_move(old, machine, "u3", "parked")
    before = _label(old, "u1")
    new = deployment.start(GATES_V2)
    service.create_label(new, new.config.get_machine("m"), "n1", {"batch": 1})
    client = create_app(new).test_client()

    dry = client.post(
        "/state-machines/m/bulk", json={"command": "upgrade", "reason": "v2", "dry_run": True}
    )
    assert dry.status_code == 200
    assert dry.json == {"count": 3, "sample": ["u1", "u2", "u3"]}  # n1 is on version 2
    accepted = client.post(
        "/state-machines/m/bulk",
        json={"command": "upgrade", "where": "metadata.batch = 1", "reason": "v2", "expect": 3},
    )
    assert accepted.status_code == 202, accepted.json
    assert run_batch(new, limit=100) == 3
    job = _json(client.get(f"/bulk/{_json(accepted)['id']}"))
    assert (job["done"], job["skipped"], job["failed"]) == (2, 0, 1)

    renamed = _label(new, "u1")
    assert (renamed.state, renamed.version) == ("holding", 2)
    assert (renamed.entry_id, renamed.state_entered_at) == (
        before.entry_id,
        before.state_entered_at,
    )
    with new.db.connect() as conn:
        last = store.history(conn, "m", "u1")[-1]
    assert (last.old_state, last.new_state, last.forced, last.reason, last.version) == (
        "waiting",
        "holding",
        True,
        "v2",
        2,
    )
    parked = _label(new, "u3")  # version 2 has no parked and no migration names it
    assert (parked.state, parked.version) == ("parked", 1)
    assert _json(client.get("/state-machines/m/labels/u1"))["version"] == 2
    assert _json(client.get("/state-machines/m/labels/u3"))["version"] == 1
    machine_page = client.get("/console/machines/m").get_data(as_text=True)
    assert "1: 1 label, 2: 3 labels" in machine_page  # the versions in use
    label_page = client.get("/console/machines/m/labels/u3").get_data(as_text=True)
    assert '<td id="version"><a href="/console/machines/m/versions">1</a>' in label_page
    # Upgraded, u1 follows version 2 now.
    assert _patch(new, "u1", {"go": True}).state == "done"

    refused = client.post(
        "/state-machines/plain/bulk", json={"command": "upgrade", "reason": "x", "dry_run": True}
    )
    assert refused.status_code == 400
    assert "continue" in _json(refused)["message"]


def _json(response: TestResponse) -> Any:
    body = response.json
    assert body is not None
    return body


def test_plan_json_counts_labels_on_older_versions(
    deployment: Deployment, database_url: str
) -> None:
    old = deployment.start(GATES_V1)
    for name in ("u1", "u2"):
        service.create_label(old, old.config.get_machine("m"), name, {})
    service.create_label(old, old.config.get_machine("plain"), "p1", {})
    new = deployment.start(GATES_V2)
    service.create_label(new, new.config.get_machine("m"), "n1", {})
    env = {"DATABASE_URL": database_url, "DB_HOST": None, "DB_NAME": None}
    planned = CliRunner().invoke(cli, ["-c", str(deployment.path), "plan", "--json"], env=env)
    assert planned.exit_code == 0, planned.output
    body = {machine["name"]: machine for machine in json.loads(planned.stdout)["state_machines"]}
    # by the version they follow, the last applied one (2) included
    assert body["m"]["versions"] == [{"version": 1, "labels": 2}, {"version": 2, "labels": 1}]
    assert body["plain"]["versions"] == []  # every label follows the definition in force
    assert body["m"]["stranded"] == []  # version 1's labels sit in states version 1 has


GATE_CHANGED = GATES_V1.replace(
    "exit_condition: metadata.go\n", "exit_condition: metadata.go = 2\n"
)


def test_plan_before_a_deploy_counts_the_labels_on_the_version_in_force(
    deployment: Deployment, database_url: str
) -> None:
    """An operator reads the plan of v2 before deploying it: the labels v1 runs are there."""
    old = deployment.start(GATES_V1)
    for name in ("u1", "u2", "u3"):
        service.create_label(old, old.config.get_machine("m"), name, {})
    path = deployment.tmp_path / "v2.yaml"
    path.write_text(GATE_CHANGED)
    env = {"DATABASE_URL": database_url, "DB_HOST": None, "DB_NAME": None}

    planned = CliRunner().invoke(cli, ["-c", str(path), "plan", "--json"], env=env)
    assert planned.exit_code == 0, planned.output
    (machine, _) = json.loads(planned.stdout)["state_machines"]
    assert (machine["name"], machine["status"], machine["applied_version"]) == ("m", "changed", 1)
    waiting = next(state for state in machine["states"] if state["name"] == "waiting")
    assert (waiting["change"], waiting["labels"]) == ("changed", 3)
    assert machine["versions"] == [{"version": 1, "labels": 3}]  # as its states count them
    text = CliRunner().invoke(cli, ["-c", str(path), "plan"], env=env)
    assert "  labels by version: 1: 3" in text.stdout
