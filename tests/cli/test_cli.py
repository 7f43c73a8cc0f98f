"""The ``routemaster`` command: validate, migrate, settings, and serve/cron as real processes."""

from __future__ import annotations

import datetime
import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from routemaster.cli import cli
from routemaster.cli.environment import settings_from_environment
from routemaster.server.application import WorkerConfig
from tests.serving import free_port
from tests.waiting import wait_answering, wait_until

REPOSITORY = Path(__file__).resolve().parents[2]

VALID = """\
state_machines:
  user:
    states:
      - gate: start
        triggers:
          - metadata: ready
        exit_condition: metadata.ready
        next: done
      - gate: done
        exit_condition: false
"""

INVALID = """\
state_machines:
  user:
    states:
      - gate: start
        exit_condition: metadata.ready == 1
        next: nowhere
"""


@pytest.fixture
def valid_config(tmp_path: Path) -> Path:
    path = tmp_path / "valid.yaml"
    path.write_text(VALID)
    return path


def _run(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    """Invoke the CLI in-process, with no database named unless ``env`` names one."""
    environment: dict[str, str | None] = {
        name: None
        for name in ("DATABASE_URL", "DB_HOST", "DB_NAME", "DB_USER", "DB_PORT", "DB_PASS")
    }
    environment.update(env or {})
    return CliRunner().invoke(cli, list(args), env=environment, catch_exceptions=False)


def test_validate_accepts_a_valid_config(valid_config: Path) -> None:
    result = _run("-c", str(valid_config), "validate")
    assert result.exit_code == 0, result.output
    assert "Config valid: 1 state machines" in result.stdout


def test_validate_lists_every_problem_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "invalid.yaml"
    path.write_text(INVALID)
    result = _run("-c", str(path), "validate")
    assert result.exit_code == 1
    assert f"{path}:5:" in result.stderr
    assert "state_machines.user.states.0.exit_condition" in result.stderr
    assert "did you mean =?" in result.stderr
    assert f"{path}:6:" in result.stderr
    assert "nowhere" in result.stderr
    assert "Config valid" not in result.stdout


def test_validate_layers_later_files_over_earlier_ones(valid_config: Path, tmp_path: Path) -> None:
    layer = tmp_path / "layer.yaml"
    layer.write_text(
        "state_machines:\n  user:\n    states:\n      - gate: only\n        exit_condition: false\n"
    )
    result = _run("-c", str(valid_config), "-c", str(layer), "validate")
    assert result.exit_code == 0, result.output


def test_validate_rejects_a_logging_plugin_that_does_not_load(
    valid_config: Path, tmp_path: Path
) -> None:
    layer = tmp_path / "plugins.yaml"
    layer.write_text("plugins:\n  logging:\n    - class: routemaster.nowhere:Logger\n")
    result = _run("-c", str(valid_config), "-c", str(layer), "validate")
    assert result.exit_code == 1
    assert "routemaster.nowhere:Logger" in result.stderr


def test_commands_that_need_a_config_say_so() -> None:
    result = CliRunner().invoke(cli, ["validate"])
    assert result.exit_code == 2
    assert "-c CONFIG.yaml" in result.output


def _insert_label(
    engine: sa.Engine, machine: str, name: str, state: str, *, deleted: bool = False
) -> None:
    """A label as a process of another configuration wrote it: its row and, unless deleted
    (whose history nets to nothing), its first history entry."""
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "WITH entry AS (INSERT INTO history (shard_key, state_machine, label, old_state,"
                " new_state, created) SELECT routemaster_shard_key(:name), :machine, :name, NULL,"
                " :state, now() WHERE NOT :deleted RETURNING id)"
                " INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id,"
                " deleted, name_key, shard_key) VALUES (:machine, :name, :state, now(),"
                " coalesce((SELECT id FROM entry), 1), :deleted, routemaster_label_key(:name),"
                " routemaster_shard_key(:name))"
            ),
            {"machine": machine, "name": name, "state": state, "deleted": deleted},
        )


def test_validate_fails_naming_labels_in_states_the_config_lacks(
    valid_config: Path, db_engine: sa.Engine, database_url: str
) -> None:
    _insert_label(db_engine, "user", "a", "start")
    _insert_label(db_engine, "user", "b", "retired_state")
    _insert_label(db_engine, "user", "c", "gone_but_deleted", deleted=True)
    _insert_label(db_engine, "old_machine", "d", "start")

    result = _run("-c", str(valid_config), "validate", env={"DATABASE_URL": database_url})
    assert result.exit_code == 1
    assert "old_machine.start" in result.stderr
    assert "user.retired_state" in result.stderr
    assert "gone_but_deleted" not in result.stderr


def test_validate_passes_when_every_label_has_its_state(
    valid_config: Path, db_engine: sa.Engine, database_url: str
) -> None:
    _insert_label(db_engine, "user", "a", "done")
    result = _run("-c", str(valid_config), "validate", env={"DATABASE_URL": database_url})
    assert result.exit_code == 0, result.output


@pytest.fixture
def empty_database(database_url: str) -> Iterator[str]:
    """A database with no tables at all, on the test server."""
    server = sa.engine.make_url(database_url)
    name = f"routemaster_cli_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_migrate_brings_an_empty_database_to_the_current_schema(empty_database: str) -> None:
    result = _run("migrate", env={"DATABASE_URL": empty_database})
    assert result.exit_code == 0, result.output
    again = _run("migrate", env={"DATABASE_URL": empty_database})
    assert again.exit_code == 0, again.output
    engine = sa.create_engine(empty_database, poolclass=sa.pool.NullPool)
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"labels", "history", "trigger_occurrences", "alembic_version"} <= tables


def test_settings_are_overridable_from_the_environment() -> None:
    settings = settings_from_environment(
        {
            "ROUTEMASTER_LEASE": "30",
            "ROUTEMASTER_BATCH_SIZE": "10",
            "ROUTEMASTER_FEED_TIMEOUT": "2.5",
            "ROUTEMASTER_WORKER_ID": "w1",
        }
    )
    assert settings.lease == datetime.timedelta(seconds=30)
    assert settings.batch_size == 10
    assert settings.feed_timeout == 2.5
    assert settings.worker_id == "w1"
    assert settings.max_transitions == settings_from_environment({}).max_transitions
    with pytest.raises(click.UsageError, match="ROUTEMASTER_BATCH_SIZE"):
        settings_from_environment({"ROUTEMASTER_BATCH_SIZE": "many"})


def _spawn(config: Path, database_url: str, *args: str) -> subprocess.Popen[bytes]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DB_")}
    env["DATABASE_URL"] = database_url
    return subprocess.Popen(
        [sys.executable, "-m", "routemaster", "-c", str(config), *args],
        cwd=REPOSITORY,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _stop(process: subprocess.Popen[bytes], within: float) -> tuple[int, str]:
    """SIGTERM, then the exit code and output; fails if it does not exit in time."""
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"did not stop within {within}s after SIGTERM:\n{output.decode()}")
    return process.returncode, output.decode()


@pytest.mark.slow
def test_serve_answers_on_the_given_address(valid_config: Path, empty_database: str) -> None:
    port = free_port()
    process = _spawn(
        valid_config, empty_database, "serve", "-b", f"127.0.0.1:{port}", "--workers", "2"
    )
    try:
        wait_answering(f"http://127.0.0.1:{port}/", process)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
            status, body = response.status, json.load(response)
    finally:
        code, output = _stop(process, within=30)
    assert status == 200
    assert body["status"] == "ok"
    assert code == 0, output
    assert "Listening at: http://127.0.0.1" in output


@pytest.mark.slow
def test_cron_migrates_runs_and_stops_on_sigterm(valid_config: Path, empty_database: str) -> None:
    process = _spawn(valid_config, empty_database, "cron")
    engine = sa.create_engine(empty_database, poolclass=sa.pool.NullPool)
    try:
        wait_until(
            lambda: "labels" in sa.inspect(engine).get_table_names(),
            lambda: f"cron did not migrate the database: {process.poll()}",
            timeout=30,
        )
        assert process.stdout is not None
        # The worker's own line (a migration's description may say "started" too).
        while " started: " not in (line := process.stdout.readline().decode()):
            assert line, "cron ended before its worker started"
        assert process.poll() is None, process.communicate()[0].decode()
    finally:
        engine.dispose()
        code, output = _stop(process, within=30)
    assert code == 0, output


def test_a_worker_reads_each_gunicorn_setting_once_after_the_fork() -> None:
    config = WorkerConfig()
    config.set("workers", 3)
    assert config.workers == 3
    config.set("workers", 5)  # before the fork, changes are seen
    assert config.workers == 5
    config.freeze()
    assert config.workers == 5
    assert vars(config)["workers"] == 5  # a plain attribute from now on
    assert config.bind == ["127.0.0.1:8000"]  # every other setting still reads right


@pytest.mark.slow
@pytest.mark.parametrize(("options", "kept"), [((), True), (("--keep-alive", "0"), False)])
def test_serve_keeps_a_clients_connection_for_its_next_request_unless_told_not_to(
    valid_config: Path, empty_database: str, options: tuple[str, ...], kept: bool
) -> None:
    port = free_port()
    process = _spawn(
        valid_config, empty_database, "serve", "-b", f"127.0.0.1:{port}", "--workers", "1", *options
    )
    try:
        wait_answering(f"http://127.0.0.1:{port}/", process)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/")
        first = connection.getresponse()
        first.read()
        socket_used = connection.sock
        connection.request("GET", "/state-machines")
        second = connection.getresponse()
        second.read()
        reused = connection.sock is socket_used and socket_used is not None
        connection.close()
    finally:
        code, output = _stop(process, within=30)
    assert first.status == 200 and second.status == 200
    assert first.will_close is not kept
    assert reused is kept
    assert code == 0, output
