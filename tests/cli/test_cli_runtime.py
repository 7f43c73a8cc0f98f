"""The command line as an operator meets it: one clear line for each mistake, 1.x spellings.

Run as real processes, so what is checked is exactly what a terminal shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import VALID
from tests.serving import free_port
from tests.waiting import wait_answering

REPOSITORY = Path(__file__).resolve().parents[2]
DATABASE_VARIABLES = ("DATABASE_URL", "DB_HOST", "DB_NAME", "DB_USER", "DB_PORT", "DB_PASS")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(VALID)
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in DATABASE_VARIABLES and not key.startswith("ROUTEMASTER_")
    }
    env.update(extra)
    return env


def _routemaster(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "routemaster", *args],
        cwd=REPOSITORY,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["serve", "cron", "migrate"])
def test_no_database_named_is_one_line_saying_what_to_set(config: Path, command: str) -> None:
    result = _routemaster("-c", str(config), command)
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "set DATABASE_URL=" in line and "ROUTEMASTER_DATABASE=embedded" in line


def test_an_unknown_database_choice_is_one_line(config: Path) -> None:
    result = _routemaster("-c", str(config), "cron", ROUTEMASTER_DATABASE="sqlite")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "ROUTEMASTER_DATABASE='sqlite'" in line


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://u:s3cret@[::1:1/x", "DATABASE_URL is not a valid database URL"),
        ("mysql://u:s3cret@127.0.0.1/x", "DATABASE_URL must name a PostgreSQL database"),
        (
            "postgresql://u:s3cret@127.0.0.1:1/x",
            "database at postgresql+psycopg2://u:***@127.0.0.1:1/x",
        ),
    ],
)
@pytest.mark.parametrize("command", ["serve", "cron", "migrate", "validate"])
def test_a_wrong_database_url_is_one_line_without_the_password(
    config: Path, command: str, url: str, expected: str
) -> None:
    result = _routemaster("-c", str(config), command, DATABASE_URL=url)
    if command == "validate" and "127.0.0.1:1/" in url:
        # validate checks labels only when it can: an unreachable server is a warning.
        assert result.returncode == 0
        [line] = result.stderr.splitlines()
        assert line.startswith("warning: ") and expected in line and "s3cret" not in line
        return
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert expected in line
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("ROUTEMASTER_BATCH_SIZE", "0", "must be at least 1"),
        ("ROUTEMASTER_BATCH_SIZE", "many", "expected a whole number"),
        ("ROUTEMASTER_DELIVERY_CONCURRENCY", "100000", "at most 1024"),
        ("ROUTEMASTER_LEASE", "-5", "must be at least 1"),
        ("ROUTEMASTER_POLL_INTERVAL", "nan", "expected a finite number"),
        ("ROUTEMASTER_FEED_TIMEOUT", "0", "at least 0.01"),
        ("ROUTEMASTER_WORKER_ID", " ", "must not be empty"),
    ],
)
def test_tuning_variables_are_checked_at_start_naming_the_variable(
    config: Path, variable: str, value: str, problem: str
) -> None:
    result = _routemaster("-c", str(config), "cron", **{variable: value})
    assert result.returncode == 2
    assert f"{variable}={value!r}" in result.stderr
    assert problem in result.stderr
    assert "Traceback" not in result.stderr


def test_config_after_the_command_and_1x_config_file_spelling(config: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "state_machines:\n  other:\n    states:\n      - gate: a\n        exit_condition: false\n"
    )
    after = _routemaster("validate", "-c", str(config))
    assert after.returncode == 0, after.stderr
    assert "1 state machines" in after.stdout
    legacy = _routemaster(f"--config-file={config}", "validate", "--config-file", str(extra))
    assert legacy.returncode == 0, legacy.stderr
    assert "2 state machines" in legacy.stdout  # layered: before the command, then after


@pytest.mark.slow
def test_json_logs_are_pure_json_lines(tmp_path: Path, database_url: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        VALID
        + "plugins:\n  logging:\n    - class: routemaster.logging:PythonLogger\n"
        + "      kwargs: {log_level: INFO, json: true}\n"
    )
    port = free_port()
    outputs: list[str] = []
    first_lines: list[str] = []
    for args in (["serve", "-b", f"127.0.0.1:{port}", "--workers", "1"], ["cron"]):
        process = subprocess.Popen(
            [sys.executable, "-m", "routemaster", "-c", str(config), *args],
            cwd=REPOSITORY,
            env=_env(DATABASE_URL=database_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            if args[0] == "serve":
                wait_answering(f"http://127.0.0.1:{port}/", process)
            else:
                assert process.stdout is not None
                # The worker's line (a migration's description may say "started" too).
                while " started: " not in (line := process.stdout.readline()):
                    assert line, "cron ended before it started"
                    first_lines.append(line)
                first_lines.append(line)
        finally:
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=30)
        outputs.append("".join(first_lines) + output)
        first_lines.clear()
    for output in outputs:
        lines = output.splitlines()
        assert lines, f"no log lines: {outputs!r}"
        for line in lines:
            record = json.loads(line)  # the whole line is one object, nothing before it
            assert isinstance(record, dict) and {"time", "level"} <= record.keys(), line
    assert any("Listening at" in line for line in outputs[0].splitlines())
    assert any("worker" in json.loads(line).get("message", "") for line in outputs[1].splitlines())


def test_the_1x_database_variables_keep_1x_defaults() -> None:
    from routemaster.db.database import url_from_environment

    assert url_from_environment({"DB_PASS": "pw"}) == (
        "postgresql+psycopg2://routemaster:pw@localhost:5432/routemaster"
    )
    assert url_from_environment(
        {"DB_HOST": "db", "DB_PORT": "6543", "DB_NAME": "rm", "DB_USER": "ann"}
    ) == ("postgresql+psycopg2://ann@db:6543/rm")
    assert url_from_environment({}) is None
