"""A real HTTP server on 127.0.0.1 that records requests and answers as scripted.

Used by the feed, webhook and worker tests in place of mocks: the code under
test makes genuine HTTP requests over a socket.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.waiting import wait_until


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b"{}"
    delay: float = 0.0  # seconds to wait before answering (to provoke timeouts)
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (Location, ...)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when received
    client_port: int  # one per TCP connection: shows keep-alive at work

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class StubServer:
    """Scripted replies per path; a path's list is consumed in order and its last reply repeats."""

    _replies: dict[str, list[Reply]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    in_flight: int = 0
    most_in_flight: int = 0  # the most requests it was answering at one time

    def start(self) -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like real receivers

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                reply = stub._record(
                    Recorded(
                        self.command,
                        self.path,
                        dict(self.headers),
                        body,
                        time.monotonic(),
                        self.client_address[1],
                    )
                )
                with stub._lock:
                    stub.in_flight += 1
                    stub.most_in_flight = max(stub.most_in_flight, stub.in_flight)
                if reply.delay:
                    time.sleep(reply.delay)
                with stub._lock:
                    stub.in_flight -= 1
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(reply.body)))
                    for name, value in reply.headers:
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def url(self, path: str) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._replies[path] = list(replies)

    def reply_json(self, path: str, value: Any, status: int = 200) -> None:
        self.script(path, Reply(status, json.dumps(value).encode()))

    def _record(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            replies = self._replies.get(request.path.split("?")[0]) or [Reply()]
            return replies.pop(0) if len(replies) > 1 else replies[0]

    def received(self, path: str | None = None) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    def wait_for(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
        wait_until(condition, lambda: f"{len(self.requests)} requests received", timeout=timeout)


def running_stub() -> Iterator[StubServer]:
    """Body of a pytest fixture: a started server, stopped afterwards."""
    stub = StubServer()
    stub.start()
    try:
        yield stub
    finally:
        stub.stop()
