"""A small server-sent events client on a raw socket, so tests see exactly what is sent."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Event:
    id: str | None
    data: Any  # the decoded JSON
    event: str | None = None  # the ``event:`` field (``gap``); None for a change


class EventStream:
    """``GET path`` with optional ``Last-Event-ID``; read events and comments as they come."""

    def __init__(self, base: str, path: str, *, last_event_id: str | None = None) -> None:
        parts = urlsplit(base)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
        headers = [f"GET {path} HTTP/1.1", f"Host: {parts.netloc}", "Accept: text/event-stream"]
        if last_event_id is not None:
            headers.append(f"Last-Event-ID: {last_event_id}")
        self.sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        self._buffer = b""
        head = self._read_until(b"\r\n\r\n", time.monotonic() + 10)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {
            name.lower(): value.strip()
            for name, _, value in (line.partition(":") for line in header_lines)
        }
        self.comments: list[str] = []
        self.retry: int | None = None

    def _read_until(self, separator: bytes, deadline: float) -> bytes:
        while separator not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"nothing complete within the deadline: {self._buffer[-200:]!r}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("the server closed the stream")
            self._buffer += data
        block, self._buffer = self._buffer.split(separator, 1)
        return block

    def json(self, timeout: float = 10) -> Any:
        """The JSON body of a response that is not a stream (an error)."""
        length = int(self.headers["content-length"])
        deadline = time.monotonic() + timeout
        while len(self._buffer) < length:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                break
            self._buffer += data
        return json.loads(self._buffer[:length])

    def next_comment(self, timeout: float = 10) -> str:
        """Read on until a comment line arrives (events on the way are dropped)."""
        seen = len(self.comments)
        deadline = time.monotonic() + timeout
        while len(self.comments) == seen:
            self._next_block(deadline)
        return self.comments[seen]

    def next_event(self, timeout: float = 10) -> Event:
        """The next event; comments and ``retry:`` lines on the way are kept."""
        deadline = time.monotonic() + timeout
        while True:
            event = self._next_block(deadline)
            if event is not None:
                return event

    def _next_block(self, deadline: float) -> Event | None:
        block = self._read_until(b"\n\n", deadline).decode()
        event_id, kind, data = None, None, []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "":
                self.comments.append(value)
            elif field == "id":
                event_id = value
            elif field == "data":
                data.append(value)
            elif field == "event":
                kind = value
            elif field == "retry":
                self.retry = int(value)
        return Event(event_id, json.loads("\n".join(data)), kind) if data else None

    def events(self, count: int, timeout: float = 20) -> list[Event]:
        deadline = time.monotonic() + timeout
        return [self.next_event(max(0.01, deadline - time.monotonic())) for _ in range(count)]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
