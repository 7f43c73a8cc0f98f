"""Limits where they live: ``routemaster serve`` (real gunicorn) over real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.api.helpers import answering
from tests.serving import free_port

REPOSITORY = Path(__file__).resolve().parents[2]
CONFIG_PATH = REPOSITORY / "tests" / "api" / "config.yaml"
LIMIT = 1024 * 1024  # the default max_request_body

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[1, 2], ids=["sync", "threads"])
def served(request: pytest.FixtureRequest, database_url: str) -> Iterator[str]:
    """``routemaster serve`` with one worker, sync or gthread, on a free port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DB_")}
    env["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "routemaster", "-c", str(CONFIG_PATH), "serve"]
    command += ["-b", f"127.0.0.1:{port}", "--workers", "1", "--threads", str(request.param)]
    process = subprocess.Popen(
        command, cwd=REPOSITORY, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    with answering(process, base, timeout=30) as url:
        yield url


@pytest.fixture
def base(served: str, db_engine: object) -> str:
    return served


def raw_exchange(base: str, data: bytes) -> tuple[int, dict[str, str], Any]:
    """Send raw bytes, read the whole answer: status, headers, decoded JSON body."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    assert headers.get("Content-Type", "").startswith("application/json"), received[:300]
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.mark.parametrize("character", ["x", "é", "😀", "文"])
def test_a_1024_character_name_in_any_script_works_end_to_end(base: str, character: str) -> None:
    name = character * 1024
    url = f"{base}/state-machines/user/labels/{quote(name, safe='')}"
    with requests.Session() as session:
        created = session.post(url, json={"metadata": {"name": name}}, timeout=10)
        assert created.status_code == 201, created.text[:300]
        assert session.get(url, timeout=10).json()["metadata"] == {"name": name}
        patched = session.patch(url, json={"metadata": {"n": 1}}, timeout=10)
        assert patched.json()["metadata"] == {"name": name, "n": 1}
        assert session.get(url + "/history", timeout=10).status_code == 200
        assert session.get(url + "/explain", timeout=10).status_code == 200
        listing = session.get(
            f"{base}/state-machines/user/labels",
            params={"limit": "1", "after": name[:200]},  # a name that sorts before it
            timeout=10,
        )
        assert listing.json()["labels"] == [{"name": name, "state": "start"}]
        assert session.post(url + "/pause", json={"reason": name}, timeout=10).status_code == 200
        assert session.delete(url, timeout=10).status_code == 204


def test_a_1025_character_name_is_400_json(base: str) -> None:
    url = f"{base}/state-machines/user/labels/{quote('😀' * 1025, safe='')}"
    response = requests.post(url, json={"metadata": {}}, timeout=10)
    assert response.status_code == 400
    assert "1024" in response.json()["message"]


def test_a_chunked_body_over_the_limit_is_413(base: str) -> None:
    url = f"{base}/state-machines/user/labels/big"

    def chunks() -> Iterator[bytes]:
        yield b'{"metadata": {"x": "'
        for _ in range(LIMIT // 65536 + 2):
            yield b"y" * 65536
        yield b'"}}'

    response = requests.post(url, data=chunks(), timeout=30)
    assert "Content-Length" not in response.request.headers
    assert response.status_code == 413
    assert str(LIMIT) in response.json()["message"]
    assert requests.get(url, timeout=10).status_code == 404


def test_a_chunked_body_under_the_limit_is_read_whole(base: str) -> None:
    url = f"{base}/state-machines/user/labels/small"
    response = requests.post(url, data=iter([b'{"metadata": ', b'{"x": 1}}']), timeout=10)
    assert response.status_code == 201
    assert response.json()["metadata"] == {"x": 1}


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NOT A REQUEST LINE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (
            b"POST /state-machines/user/labels/a HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nZZ\r\nbody\r\n0\r\n\r\n",
            400,
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Name: v\r\n\r\n", 400),
    ],
    ids=["request line", "header too large", "bad chunk", "bad header name"],
)
def test_what_gunicorn_refuses_is_still_answered_in_json(
    base: str, request_bytes: bytes, status: int
) -> None:
    code, _, body = raw_exchange(base, request_bytes)
    assert code == status
    assert isinstance(body["message"], str) and body["message"]


def test_an_endless_request_line_gets_414_and_costs_the_worker_nothing(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    memory_before = _serve_memory(int(port))
    assert memory_before > 0  # the master and its worker were found
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /state-machines/")
        try:
            for _ in range(24):  # 24 MiB, never a line end
                sock.sendall(b"a" * (1024 * 1024))
        except OSError:  # the server answered and closed long before
            pass
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
    assert received.startswith(b"HTTP/1.1 414 "), received[:200]
    assert b"application/json" in received
    assert _serve_memory(int(port)) - memory_before < 16 * 1024 * 1024
    assert requests.get(f"{base}/state-machines", timeout=10).ok  # and it serves on


def test_a_listing_after_the_longest_name_fits_the_request_line(base: str) -> None:
    name = "😀" * 1024  # 12 KiB percent-encoded: twice in one listing's query
    encoded, prefix = quote(name, safe=""), quote(name[:1000], safe="")
    url = f"{base}/state-machines/user/labels/{encoded}"
    assert requests.post(url, json={"metadata": {}}, timeout=10).status_code in (201, 409)
    query = f"prefix={prefix}&after={encoded}"
    assert len(query) > 24_000
    listing = requests.get(f"{base}/state-machines/user/labels?{query}", timeout=10)
    assert listing.status_code == 200, listing.text[:300]


def _serve_memory(port: int) -> int:
    """Resident bytes of the ``serve`` bound to ``port`` and its workers, from /proc."""
    bind = f"127.0.0.1:{port}".encode()
    parents: dict[int, int] = {}
    masters: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            parents[int(entry.name)] = int(
                (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            )
        except (OSError, ValueError):
            continue
        if b"serve" in command and bind in command:
            masters.add(int(entry.name))
    total = 0
    for pid, parent in parents.items():
        if pid in masters or parent in masters:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total
