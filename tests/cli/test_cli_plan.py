"""``plan``, ``migrate -c``, and the start-up check of ``serve`` and ``cron`` (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import sqlalchemy as sa
from click.testing import CliRunner

from routemaster.cli import cli
from tests.serving import free_port

ROOT = Path(__file__).resolve().parents[2]

OLD = """
state_machines:
  order:
    states:
      - gate: pending
        triggers: [{metadata: paid}]
        exit_condition: metadata.paid
        next:
          type: context
          path: metadata.cancel
          default: done
          destinations: [{value: true, state: cancelled}]
      - gate: cancelled
        exit_condition: false
      - gate: done
        exit_condition: false
"""

NEW = """
state_machines:
  order:
    states:
      - gate: awaiting_payment
        triggers: [{metadata: paid}]
        exit_condition: metadata.paid
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - rename: {from: pending, to: awaiting_payment}
"""

STRANDED = (
    "Labels would be stranded in states the configuration no longer has:"
    " order.cancelled (2 labels)."
)


def _run(database_url: str, *args: str) -> click.testing.Result:
    env = {"DATABASE_URL": database_url, "DB_HOST": None, "DB_NAME": None}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _insert(engine: sa.Engine, name: str, state: str) -> None:
    """A label as a process of another configuration wrote it: its row and first entry."""
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "WITH entry AS (INSERT INTO history (shard_key, state_machine, label, old_state,"
                " new_state, created) VALUES (routemaster_shard_key(:name), 'order', :name,"
                " NULL, :state, now()) RETURNING id)"
                " INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id,"
                " name_key, shard_key) SELECT 'order', :name, :state, now(), entry.id,"
                " routemaster_label_key(:name), routemaster_shard_key(:name) FROM entry"
            ),
            {"name": name, "state": state},
        )


def test_plan_names_stranded_labels_and_serve_and_cron_refuse(
    tmp_path: Path, db_engine: sa.Engine, database_url: str
) -> None:
    old, new = _write(tmp_path, "old.yaml", OLD), _write(tmp_path, "new.yaml", NEW)
    assert _run(database_url, "-c", old, "migrate").exit_code == 0
    for name, state in (("a", "pending"), ("b", "cancelled"), ("c", "cancelled")):
        _insert(db_engine, name, state)

    planned = _run(database_url, "-c", new, "plan")
    assert planned.exit_code == 1
    assert STRANDED in planned.stderr
    assert "order: changed (against version 1)" in planned.stdout
    assert "  renamed pending -> awaiting_payment: 1 label" in planned.stdout
    assert "  removed cancelled: 2 labels STRANDED" in planned.stdout

    validated = _run(database_url, "-c", new, "validate")
    assert (validated.exit_code, STRANDED in validated.stderr) == (1, True)
    refused = _run(database_url, "-c", new, "migrate")
    assert (refused.exit_code, STRANDED in refused.stderr) == (1, True)
    cron = _run(database_url, "-c", new, "cron")
    assert (cron.exit_code, STRANDED in cron.stderr) == (1, True)
    # serve's worker trusts serve's check only for the configuration serve checked: one that
    # differs (a file changed meanwhile) is checked again, by the worker itself.
    other = json.dumps({"order": [1, "the digest of another definition"]})
    cron = _run(database_url, "-c", new, "cron", "--checked", other)
    assert (cron.exit_code, STRANDED in cron.stderr) == (1, True)

    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    serve = subprocess.run(
        [sys.executable, "-m", "routemaster", "-c", new, "serve", "-b", f"127.0.0.1:{free_port()}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 1
    assert STRANDED in serve.stderr
    with db_engine.connect() as conn:  # nothing was applied
        states = conn.execute(sa.text("SELECT name, state FROM labels ORDER BY name")).all()
        versions = conn.execute(sa.text("SELECT count(*) FROM machine_versions")).scalar_one()
    assert [tuple(row) for row in states] == [
        ("a", "pending"),
        ("b", "cancelled"),
        ("c", "cancelled"),
    ]
    assert versions == 1


def test_plan_json_then_migrate_twice(
    tmp_path: Path, db_engine: sa.Engine, database_url: str
) -> None:
    old, new = _write(tmp_path, "old.yaml", OLD), _write(tmp_path, "new.yaml", NEW)
    assert _run(database_url, "-c", old, "migrate").exit_code == 0
    _insert(db_engine, "a", "pending")
    _insert(db_engine, "b", "done")

    planned = _run(database_url, "-c", new, "plan", "--json")
    assert planned.exit_code == 0, planned.output
    body = json.loads(planned.stdout)
    assert body["stranded"] == []
    (machine,) = body["state_machines"]
    assert (machine["name"], machine["status"], machine["applied_version"]) == (
        "order",
        "changed",
        1,
    )
    assert machine["states"] == [
        {"name": "done", "change": "unchanged", "labels": None},  # holds labels, not counted
        {"name": "pending", "change": "renamed", "labels": 1, "to": "awaiting_payment"},
        {"name": "cancelled", "change": "removed", "labels": 0},
    ]

    first = _run(database_url, "-c", new, "migrate")
    assert first.exit_code == 0, first.output
    assert "Migrated 1 labels" in first.stderr
    with db_engine.connect() as conn:
        history = conn.execute(sa.text("SELECT count(*) FROM history")).scalar_one()
    second = _run(database_url, "-c", new, "migrate")
    assert second.exit_code == 0, second.output
    assert "Migrated" not in second.stderr
    with db_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM history")).scalar_one() == history
        versions = (
            conn.execute(sa.text("SELECT version FROM machine_versions ORDER BY version"))
            .scalars()
            .all()
        )
        state = conn.execute(sa.text("SELECT state FROM labels WHERE name = 'a'")).scalar_one()
    assert (versions, state) == ([1, 2], "awaiting_payment")
    again = json.loads(_run(database_url, "-c", new, "plan", "--json").stdout)
    assert again["state_machines"][0]["status"] == "unchanged"
