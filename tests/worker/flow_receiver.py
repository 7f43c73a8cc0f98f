"""A real HTTP receiver for the flow tests: answers after a delay, and records per flow key
how many calls it was answering at once and the order in which calls started."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FlowReceiver:
    delay: float = 0.05
    key_path: tuple[str, ...] = ("customer",)
    started: list[tuple[float, Any, str]] = field(default_factory=list)  # (at, key, label)
    in_flight: Counter[Any] = field(default_factory=Counter)
    most: Counter[Any] = field(default_factory=Counter)  # the most in flight at once, per key
    total_in_flight: int = 0
    most_total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    def key_of(self, body: dict[str, Any]) -> Any:
        value: Any = body.get("metadata", {})
        for part in self.key_path:
            value = value.get(part) if isinstance(value, dict) else None
        return value

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def keys_in_order(self) -> list[Any]:
        with self.lock:
            return [key for _, key, _ in sorted(self.started, key=lambda item: item[0])]


@contextmanager
def flow_receiver(delay: float = 0.05) -> Iterator[FlowReceiver]:
    receiver = FlowReceiver(delay=delay)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            key = receiver.key_of(body)
            with receiver.lock:
                receiver.started.append((time.monotonic(), key, body["label"]))
                receiver.in_flight[key] += 1
                receiver.most[key] = max(receiver.most[key], receiver.in_flight[key])
                receiver.total_in_flight += 1
                receiver.most_total = max(receiver.most_total, receiver.total_in_flight)
            time.sleep(receiver.delay)
            with receiver.lock:
                receiver.in_flight[key] -= 1
                receiver.total_in_flight -= 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
