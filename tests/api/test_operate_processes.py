"""Operating real ``routemaster serve`` processes: revocation, summed metrics, true responses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from tests.api.openapi_check import check_response
from tests.api.tokens import tokens_layer
from tests.serving import free_port, session_environment, stop_all
from tests.waiting import wait_answering, wait_until

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
CONFIG = HERE / "config.yaml"


@pytest.fixture
def fresh_database(database_url: str) -> Iterator[str]:
    """A database of its own, so no other process listens for its token changes."""
    server = sa.engine.make_url(database_url)
    name = f"routemaster_ops_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield server.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


class Service:
    """``routemaster`` commands on one database and config, and the servers they started."""

    def __init__(self, database_url: str, configs: list[Path], tmp_path: Path) -> None:
        self.configs = configs
        self.tmp_path = tmp_path
        self.env = dict(
            os.environ,
            **session_environment(database_url),
            DATABASE_URL=database_url,
            TMPDIR=str(tmp_path),  # where serve makes its metrics directory
            ROUTEMASTER_TOKEN_USE_INTERVAL="0.2",
        )
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.servers: list[tuple[subprocess.Popen[bytes], Path]] = []

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        config_args = [arg for path in self.configs for arg in ("-c", str(path))]
        return subprocess.run(
            [sys.executable, "-m", "routemaster", *config_args, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def serve(self, workers: int) -> str:
        port = free_port()
        log = self.tmp_path / f"serve{len(self.servers)}.log"
        config_args = [arg for path in self.configs for arg in ("-c", str(path))]
        command = [sys.executable, "-m", "routemaster", *config_args, "serve"]
        command += ["-b", f"127.0.0.1:{port}", "--workers", str(workers)]
        with log.open("wb") as output:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self.servers.append((process, log))
        base = f"http://127.0.0.1:{port}"
        wait_answering(base + "/", process)
        assert requests.get(base + "/", timeout=2).status_code == 200, log.read_text()
        return base

    def stop(self) -> str:
        """SIGTERM every server; their output."""
        stop_all(process for process, _ in self.servers)
        return "".join(log.read_text() for _, log in self.servers)


@pytest.fixture
def service(fresh_database: str, tmp_path: Path) -> Iterator[Service]:
    layer = tokens_layer(tmp_path)
    running = Service(fresh_database, [CONFIG, layer], tmp_path)
    yield running
    running.stop()


def _listeners(database_url: str) -> int:
    engine = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'routemaster token cache' AND datname = current_database()"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_revoked_token_stops_at_once_in_every_api_process(
    service: Service, fresh_database: str
) -> None:
    first, second = service.serve(workers=1), service.serve(workers=1)
    wait_until(
        lambda: _listeners(fresh_database) >= 2, "each process's cache listening", timeout=20
    )
    created = service.command("token", "create", "ci", "--scope", "read", "--scope", "write")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert "2 running API process(es) confirmed" in created.stderr
    headers = {"Authorization": f"Bearer {secret}"}
    for base in (first, second):
        assert requests.get(base + "/state-machines", headers=headers, timeout=5).ok

    listed = service.command("token", "list")
    assert listed.returncode == 0
    assert "ci" in listed.stdout
    assert secret not in listed.stdout + listed.stderr

    revoked = service.command("token", "revoke", "ci")
    assert revoked.returncode == 0, revoked.stderr
    assert "Revoked token 'ci'; 2 running API process(es) confirmed." in revoked.stderr
    for base in (first, second):
        refused = requests.get(base + "/state-machines", headers=headers, timeout=5)
        assert refused.status_code == 401
        assert refused.json() == {"message": "The token is not valid (unknown or revoked)."}
    again = service.command("token", "revoke", "ci")
    assert again.returncode == 1
    assert "no token called 'ci'" in again.stderr
    output = service.stop()
    assert secret not in output
    assert secret[3:19] not in output  # not even the key id


@pytest.mark.slow
def test_last_use_shows_in_the_token_list(service: Service) -> None:
    base = service.serve(workers=1)
    secret = service.command("token", "create", "ci", "--scope", "read").stdout.strip()
    assert "never" in service.command("token", "list").stdout
    headers = {"Authorization": f"Bearer {secret}"}
    assert requests.get(base + "/state-machines", headers=headers, timeout=5).ok

    def used() -> str:
        listed = service.command("token", "list").stdout
        return "" if "never" in listed else listed

    listed = wait_until(
        used,
        "the last use listed",
        timeout=20,
        every=0.2,
    )
    assert listed.splitlines()[0].split() == ["NAME", "SCOPES", "CREATED", "LAST", "USED"]


def _count(text: str, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


@pytest.mark.slow
def test_metrics_are_one_view_across_two_gunicorn_workers(
    fresh_database: str, tmp_path: Path
) -> None:
    service = Service(fresh_database, [CONFIG], tmp_path)
    try:
        base = service.serve(workers=2)

        def hit(_: int) -> list[int]:
            # A connection per request: the two sync workers take turns.
            return [
                requests.get(base + "/state-machines", timeout=10).status_code for _ in range(10)
            ]

        directories = list(tmp_path.glob("routemaster-metrics-*"))
        assert len(directories) == 1

        def writers() -> set[str]:
            return {path.stem.rsplit("_", 1)[1] for path in directories[0].glob("counter_*.db")}

        sent = 0
        deadline = time.monotonic() + 30
        while len(writers()) < 2:  # until both workers have answered some
            assert time.monotonic() < deadline, "only one worker ever answered"
            with ThreadPoolExecutor(6) as pool:
                statuses = [s for batch in pool.map(hit, range(6)) for s in batch]
            assert statuses == [200] * 60
            sent += 60
        for _ in range(6):  # whichever worker answers the scrape, the totals are the same
            text = requests.get(base + "/metrics", timeout=10).text
            requests_total = "routemaster_http_requests_total"
            assert _count(text, requests_total, endpoint="/state-machines", status="200") == sent
            assert _count(text, "routemaster_labels", state_machine="user", state="start") == 0
    finally:
        output = service.stop()
    assert not list(tmp_path.glob("routemaster-metrics-*")), output


@pytest.mark.slow
def test_real_responses_match_the_document(service: Service) -> None:
    base = service.serve(workers=1)
    secret = service.command("token", "create", "all", "--scope", "read", "--scope", "write")
    headers = {"Authorization": f"Bearer {secret.stdout.strip()}"}
    document = requests.get(base + "/openapi.json", headers=headers, timeout=5).json()
    label = base + "/state-machines/user/labels/caf%C3%A9%2Fx"
    exchanges: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", base + "/", {}),
        ("GET", base + "/metrics", {}),
        ("POST", label, {"json": {"metadata": {"ready": True}}, "headers": headers}),
        ("POST", label, {"json": {"metadata": {}}, "headers": headers}),
        ("GET", label, {"headers": headers}),
        ("PATCH", label, {"json": {"metadata": {"approved": True}}, "headers": headers}),
        ("PATCH", label, {"data": b"not json", "headers": headers}),
        ("GET", label + "/history", {"headers": headers}),
        ("GET", label + "/explain", {"headers": headers}),
        ("GET", base + "/state-machines/user/labels?limit=1", {"headers": headers}),
        ("GET", base + "/state-machines/user", {"headers": headers}),
        ("POST", label + "/pause", {"headers": headers}),
        ("GET", label, {}),
        ("GET", base + "/state-machines/nope/labels", {"headers": headers}),
        ("DELETE", label, {"headers": headers}),
        ("GET", label, {"headers": headers}),
    ]
    statuses = []
    for method, url, kwargs in exchanges:
        response = requests.request(method, url, timeout=10, **kwargs)
        statuses.append(response.status_code)
        check_response(
            document,
            method,
            urlsplit(url).path,
            response.status_code,
            response.headers.get("Content-Type"),
            response.content,
        )
    expected = [200, 200, 201, 409, 200, 200, 400, 200, 200, 200, 200, 403, 401, 404, 204, 410]
    assert statuses == expected
