"""``pip install routemaster`` works: a wheel built from the files the Dockerfile copies,
installed into a fresh virtualenv outside the checkout, migrates, validates, serves and
runs the worker."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.serving import free_port
from tests.waiting import wait_answering

REPOSITORY = Path(__file__).resolve().parents[1]
CONFIG = """\
state_machines:
  m:
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: metadata.go = true
        next: done
      - gate: done
        exit_condition: false
"""


def _build_stage_sources() -> list[str]:
    """What the Dockerfile's build stage copies: the wheel is built from exactly that."""
    sources: list[str] = []
    for line in (REPOSITORY / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM") and sources:
            break
        if line.startswith("COPY ") and "--from" not in line:
            sources.extend(part.rstrip("/") for part in line.split()[1:-1])
    return sources


def _run(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(arg) for arg in args], capture_output=True, text=True, check=False, cwd=cwd, env=env
    )


@pytest.mark.slow
def test_the_built_wheel_installed_elsewhere_is_a_working_service(
    tmp_path: Path, database_url: str
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    sources = _build_stage_sources()
    assert {"pyproject.toml", "routemaster", "migrations"} <= set(sources)
    for name in sources:
        path = REPOSITORY / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    built = _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", source
    )
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("routemaster-*.whl")

    venv = tmp_path / "venv"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    # Its dependencies come from this interpreter's site-packages (no network needed);
    # a path in a .pth file does not run that directory's own .pth files, so this
    # checkout's editable install stays out of sight.
    [site] = (venv / "lib").glob("python3*/site-packages")
    (site / "dependencies.pth").write_text(
        "\n".join(sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})) + "\n"
    )
    python = venv / "bin" / "python"
    installed = _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-deps",
        "--ignore-installed",
        wheel,
    )
    assert installed.returncode == 0, installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.yaml").write_text(CONFIG)
    server = sa.engine.make_url(database_url)
    name = f"wheel_{os.getpid()}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DB_", "ROUTEMASTER_", "PYTHON")) and key != "DATABASE_URL"
    }
    env["DATABASE_URL"] = server.set(database=name).render_as_string(hide_password=False)
    routemaster = venv / "bin" / "routemaster"
    try:
        where = _run(python, "-c", "import routemaster; print(routemaster.__file__)", cwd=elsewhere)
        assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

        migrated = _run(routemaster, "-c", "config.yaml", "migrate", cwd=elsewhere, env=env)
        assert migrated.returncode == 0, migrated.stderr
        assert "Database schema and labels are current." in migrated.stdout
        validated = _run(routemaster, "-c", "config.yaml", "validate", cwd=elsewhere, env=env)
        assert validated.returncode == 0, validated.stderr

        port = free_port()
        serve = subprocess.Popen(
            [
                routemaster,
                "-c",
                "config.yaml",
                "serve",
                "-b",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
            ],
            cwd=elsewhere,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        cron = subprocess.Popen(
            [routemaster, "-c", "config.yaml", "cron"],
            cwd=elsewhere,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_answering(f"http://127.0.0.1:{port}/", serve)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
                assert answer.status == 200
            assert cron.poll() is None, cron.communicate()[0]
        finally:
            for process in (serve, cron):
                process.send_signal(signal.SIGTERM)
                output, _ = process.communicate(timeout=30)
                assert process.returncode == 0, output
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
