"""``routemaster serve``'s default worker: connections kept alive, requests answered inline.

One worker process, one thread, over real sockets: what a client relies on
is that its connection serves request after request (pipelined ones too)
and that someone else's idle connection holds nobody up.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.serving import free_port
from tests.waiting import wait_answering

REPOSITORY = Path(__file__).resolve().parents[2]
CONFIG_PATH = REPOSITORY / "tests" / "api" / "config.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(database_url: str) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DB_", "WEB_"))}
    env["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "routemaster", "-c", str(CONFIG_PATH), "serve"]
    command += ["-b", f"127.0.0.1:{port}", "--workers", "1"]
    process = subprocess.Popen(
        command, cwd=REPOSITORY, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_answering(f"http://127.0.0.1:{port}/", process)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        process.wait(timeout=30)


def _read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` whole HTTP responses (each with a Content-Length) from ``sock``."""
    received, responses = b"", list[bytes]()
    while len(responses) < count:
        head_end = received.find(b"\r\n\r\n")
        if head_end >= 0:
            head = received[:head_end].decode("latin-1")
            length = next(
                int(line.split(":", 1)[1])
                for line in head.split("\r\n")
                if line.lower().startswith("content-length:")
            )
            end = head_end + 4 + length
            if len(received) >= end:
                responses.append(received[:end])
                received = received[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(responses)} responses"
        received += chunk
    return responses


def test_pipelined_requests_on_one_connection_are_all_answered_in_order(
    served: tuple[str, int],
) -> None:
    request = b"GET /state-machines/%s HTTP/1.1\r\nHost: test\r\n\r\n"
    with socket.create_connection(served, timeout=10) as sock:
        sock.sendall(request % b"user" + request % b"empty" + request % b"nope")
        answers = _read_responses(sock, 3)
        sock.sendall(request % b"user")  # and the connection still serves the next one
        answers += _read_responses(sock, 1)
    assert [answer.split(b" ", 2)[1] for answer in answers] == [b"200", b"200", b"404", b"200"]
    assert b'"name":"empty"' in answers[1]


def test_a_connection_that_sends_nothing_holds_up_no_other_client(
    served: tuple[str, int],
) -> None:
    with socket.create_connection(served, timeout=10):  # connected, silent
        started = time.monotonic()
        response = requests.get(f"http://{served[0]}:{served[1]}/", timeout=5)
        waited = time.monotonic() - started
    assert response.status_code == 200
    assert waited < 2  # gthread's own wait for a first byte is 5 s: not spent here


def test_a_large_answer_on_a_kept_alive_connection_arrives_whole(
    served: tuple[str, int],
) -> None:
    """The socket waits on the poller unblocked between requests; a request's writes block."""
    request = b"GET %s HTTP/1.1\r\nHost: test\r\n\r\n"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server must wait on us
        sock.settimeout(10)
        sock.connect(served)
        sock.sendall(request % b"/")
        _read_responses(sock, 1)
        sock.sendall(request % b"/openapi.json")
        (answer,) = _read_responses(sock, 1)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ") and len(body) > 64 * 1024


def test_a_request_that_is_not_plain_is_served_by_gunicorns_parser_on_the_same_connection(
    served: tuple[str, int],
) -> None:
    """``Expect: 100-continue`` (not a plain request) between two plain ones."""
    name = f"expect-{os.getpid()}-{time.monotonic_ns()}".encode()
    body = b'{"metadata": {"n": 1}}'
    head = (
        b"POST /state-machines/user/labels/%s HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n"
        b"Expect: 100-continue\r\n\r\n" % (name, len(body))
    )
    plain = b"GET /state-machines/user/labels/%s HTTP/1.1\r\nHost: test\r\n\r\n" % name
    with socket.create_connection(served, timeout=10) as sock:
        sock.sendall(plain)
        (missing,) = _read_responses(sock, 1)
        sock.sendall(head)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk
            received += chunk
        assert received == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        (created,) = _read_responses(sock, 1)
        sock.sendall(plain)
        (found,) = _read_responses(sock, 1)
    assert [r.split(b" ", 2)[1] for r in (missing, created, found)] == [b"404", b"201", b"200"]
    assert b'"n":1' in found.replace(b" ", b"")
