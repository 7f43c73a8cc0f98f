"""Raw-path routing under real HTTP servers: Werkzeug's, and gunicorn with forked workers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import flask
import pytest
import requests
from werkzeug.serving import make_server

from tests.api.helpers import answering
from tests.serving import free_port

HERE = Path(__file__).parent
REPOSITORY = HERE.parents[1]
CONFIG_PATH = HERE / "config.yaml"


def exercise(base: str) -> None:
    """Create, read, patch and list labels whose names need percent-encoding."""
    with requests.Session() as session:
        for raw, name in [("a%2Fb", "a/b"), ("caf%C3%A9%20%25", "café %"), ("x%2F%2Fy", "x//y")]:
            url = f"{base}/state-machines/user/labels/{raw}"
            created = session.post(url, json={"metadata": {"name": name}}, timeout=10)
            assert created.status_code == 201, created.text
            assert session.get(url, timeout=10).json()["metadata"] == {"name": name}
            assert session.patch(url, json={"metadata": {"n": 1}}, timeout=10).status_code == 200
            assert session.get(url + "/history", timeout=10).status_code == 200
        listed = session.get(f"{base}/state-machines/user/labels", timeout=10).json()
        assert {entry["name"] for entry in listed["labels"]} == {"a/b", "café %", "x//y"}
        assert session.get(f"{base}/state-machines/user/labels/a/b", timeout=10).status_code == 404
        assert session.get(f"{base}/", timeout=10).status_code == 200


def test_werkzeug_server(flask_app: flask.Flask) -> None:
    server = make_server("127.0.0.1", 0, flask_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        exercise(f"http://127.0.0.1:{server.port}")
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture
def gunicorn(database_url: str, db_engine: object) -> Iterator[str]:
    port = free_port()
    env = dict(
        os.environ,
        ROUTEMASTER_TEST_DATABASE_URL=database_url,
        ROUTEMASTER_TEST_CONFIG=str(CONFIG_PATH),
        PYTHONPATH=os.pathsep.join([str(REPOSITORY), str(HERE)]),
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--preload",
            "--workers",
            "2",
            "--threads",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "wsgi_entry:application",
        ],
        cwd=HERE,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    with answering(process, base, timeout=20) as url:
        yield url


def test_gunicorn_with_preloaded_app_and_forked_workers(gunicorn: str) -> None:
    exercise(gunicorn)
    # Concurrent fresh connections reach both workers at once: a pooled connection
    # inherited from the preloading parent would be used by both and corrupt.
    url = gunicorn + "/state-machines/user/labels/a%2Fb"

    def hammer(_: int) -> list[int]:
        return [requests.get(url, timeout=10).status_code for _ in range(25)]

    with ThreadPoolExecutor(8) as pool:
        statuses = [status for batch in pool.map(hammer, range(8)) for status in batch]
    assert set(statuses) == {200}
