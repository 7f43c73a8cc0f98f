"""Changes streams: one thread per API process reads new changes for every open stream.

A stream is a subscriber with a filter (one machine, or all) and a cursor
(:class:`~routemaster.db.changes.Position`). Every ``changes_poll_interval``
the hub's thread groups the subscribers by (filter, cursor), reads each
group's next changes in one query, encodes them once as server-sent events
and hands the same bytes to every member; streams that have caught up share
a cursor, so many open streams cost one query per machine filter. Idle
streams get a comment line every ``stream_heartbeat`` seconds, which keeps
proxies from closing them and tells the hub when a client has gone.

Where the bytes go is a sink. Under our gunicorn workers
(:mod:`routemaster.server.workers`) the stream's socket is taken from the
request worker and written by the hub thread, without blocking, so an open
stream holds no request worker at all. Under any other WSGI server the
response body is a generator fed by the hub, and the server's thread
serving it waits on it.

The hub polls rather than listening for ``NOTIFY``: a ``NOTIFY`` in every
write transaction would serialise their commits (PostgreSQL takes a global
lock at commit for it), and a short poll by a few processes costs nothing.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import sqlalchemy as sa

from routemaster.app import Settings
from routemaster.db.changes import Change, Position, read_changes
from routemaster.db.events import change_data
from routemaster.db.horizon import Horizon

logger = logging.getLogger(__name__)

PAGE = 1_000  # changes per query
HIGH_WATER = 1 << 20  # bytes waiting for a client before the hub stops reading for it
STALLED_AFTER = 120.0  # seconds a taken socket may refuse every byte before it is dropped
PREAMBLE = b"retry: 2000\n\n"  # EventSource reconnects after 2 s
HEARTBEAT = b": keep-alive\n\n"


STREAM_KEY = "routemaster.stream"
"""The WSGI environ key under which a view leaves what writes its body from another thread
(a changes :class:`PendingStream`, a waiting task claim: anything with ``attach_socket``)
for the server to attach to the client's socket (:mod:`routemaster.server.handoff`)."""


class TooManyStreams(Exception):
    """This process already serves ``max_streams`` streams."""


def encode(change: Change) -> bytes:
    """One server-sent event: ``id:`` the position, ``data:`` the change as JSON."""
    payload = json.dumps(change_data(change), separators=(",", ":"), ensure_ascii=False)
    return f"id: {change.position}\ndata: {payload}\n\n".encode()


def encode_gap(oldest: Position) -> bytes:
    """The event that says retention removed changes the stream would have sent.

    Its ``id:`` is the position the stream continues after, so a client that
    reconnects from it is not told twice.
    """
    payload = json.dumps({"kind": "gap", "oldest": str(oldest)}, separators=(",", ":"))
    return f"event: gap\nid: {oldest}\ndata: {payload}\n\n".encode()


class _Sink(Protocol):
    closed: bool

    def backlog(self) -> int: ...

    def send(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class _QueueSink:
    """Bytes for a generator running in the WSGI server's thread."""

    def __init__(self) -> None:
        self.closed = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._ready = threading.Condition()

    def backlog(self) -> int:
        return self._size

    def send(self, data: bytes) -> None:
        with self._ready:
            self._chunks.append(data)
            self._size += len(data)
            self._ready.notify()

    def take(self, timeout: float) -> bytes:
        with self._ready:
            self._ready.wait_for(lambda: self._chunks or self.closed, timeout)
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._size = 0
            return data

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify()


class _SocketSink:
    """A client socket taken from the HTTP server, written by the hub thread without blocking."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.closed = False
        self._buffer = bytearray(head)
        self._progress = time.monotonic()

    def fileno(self) -> int:
        return self.sock.fileno()

    def backlog(self) -> int:
        return len(self._buffer)

    def send(self, data: bytes) -> None:
        self._buffer += data
        self.flush()

    def flush(self) -> None:
        while self._buffer and not self.closed:
            try:
                sent = self.sock.send(self._buffer)
            except (BlockingIOError, InterruptedError):
                if time.monotonic() - self._progress > STALLED_AFTER:
                    self.close()
                return
            except OSError:
                self.close()
                return
            del self._buffer[:sent]
            self._progress = time.monotonic()

    def readable(self) -> None:
        """The client sent something or hung up; it never needs to send anything."""
        try:
            if not self.sock.recv(4096):
                self.close()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()


@dataclass(eq=False)
class _Subscriber:
    machine: str | None
    reached: Position
    sink: _Sink
    last_sent: float = field(default_factory=time.monotonic)


class PendingStream:
    """A stream the API has accepted, not yet attached to a sink.

    Exactly one of :meth:`events` (iterated by a WSGI server) or
    :meth:`attach_socket` (a taken connection) starts it.
    """

    def __init__(self, hub: ChangeHub, machine: str | None, after: Position) -> None:
        self.hub = hub
        self.machine = machine
        self.after = after

    def events(self) -> Iterator[bytes]:
        sink = _QueueSink()
        self.hub.attach(_Subscriber(self.machine, self.after, sink))
        try:
            yield PREAMBLE
            while not sink.closed:
                data = sink.take(timeout=1.0)
                if data:
                    yield data
        finally:
            sink.close()
            self.hub.wake()

    def attach_socket(self, sock: socket.socket, head: bytes) -> None:
        self.hub.attach(_Subscriber(self.machine, self.after, _SocketSink(sock, head + PREAMBLE)))


class ChangeHub:
    """The process's stream reader: a thread that runs while any stream is open."""

    def __init__(self, engine: sa.Engine, settings: Settings, horizon: Horizon) -> None:
        self._engine = engine
        self._horizon = horizon
        self._settings = settings
        self._lock = threading.Lock()
        self._arriving: list[_Subscriber] = []
        self._count = 0  # open streams, arriving ones included
        self._thread: threading.Thread | None = None
        self._wake_fds: tuple[int, int] | None = None
        self._failing = False  # the last read failed: say so once, not every poll

    @property
    def open_streams(self) -> int:
        return self._count

    def subscribe(self, machine: str | None, after: Position) -> PendingStream:
        if self._count >= self._settings.max_streams:
            raise TooManyStreams(f"this process serves {self._count} streams already")
        return PendingStream(self, machine, after)

    def attach(self, subscriber: _Subscriber) -> None:
        with self._lock:
            self._arriving.append(subscriber)
            self._count += 1
            if self._thread is None:
                self._wake_fds = os.pipe()
                for fd in self._wake_fds:
                    os.set_blocking(fd, False)
                self._thread = threading.Thread(
                    target=self._run, name="routemaster-changes", daemon=True
                )
                self._thread.start()
        self.wake()

    def wake(self) -> None:
        with self._lock:  # the thread closes the pipe under the lock when it stops
            if self._wake_fds is not None:
                with contextlib.suppress(BlockingIOError):  # full of wake-ups already
                    os.write(self._wake_fds[1], b"x")

    def forget_after_fork(self) -> None:
        """A forked child has none of the parent's streams or thread."""
        self._lock = threading.Lock()
        self._arriving = []
        self._count = 0
        self._thread = None
        self._wake_fds = None

    def _run(self) -> None:
        assert self._wake_fds is not None
        wake_read = self._wake_fds[0]
        selector = selectors.DefaultSelector()
        selector.register(wake_read, selectors.EVENT_READ)
        subscribers: list[_Subscriber] = []
        next_read = 0.0
        more = False
        try:
            while True:
                with self._lock:
                    arriving, self._arriving = self._arriving, []
                    subscribers += arriving
                    for gone in [s for s in subscribers if s.sink.closed]:
                        subscribers.remove(gone)
                        self._count -= 1
                        if isinstance(gone.sink, _SocketSink):
                            with contextlib.suppress(KeyError):  # closed before registered
                                selector.unregister(gone.sink)
                    if not subscribers:
                        self._stopped()
                        break
                for subscriber in arriving:
                    if isinstance(subscriber.sink, _SocketSink):
                        selector.register(subscriber.sink, selectors.EVENT_READ)
                now = time.monotonic()
                if arriving or more or now >= next_read:
                    more = self._read(subscribers, now)
                    next_read = now + self._settings.changes_poll_interval
                self._heartbeat(subscribers, now)
                self._watch_writes(selector, subscribers)
                timeout = 0.0 if more else max(0.0, next_read - time.monotonic())
                for key, events in selector.select(min(timeout, self._settings.stream_heartbeat)):
                    if key.fileobj == wake_read:
                        _drain(wake_read)
                        continue
                    sink = key.fileobj
                    assert isinstance(sink, _SocketSink)
                    if events & selectors.EVENT_READ:
                        sink.readable()
                    if events & selectors.EVENT_WRITE:
                        sink.flush()
        except Exception:
            logger.exception("the changes stream thread failed; closing its streams")
            with self._lock:
                subscribers += self._arriving
                self._arriving, self._count = [], 0
                self._stopped()
            for subscriber in subscribers:
                subscriber.sink.close()
        selector.close()

    def _stopped(self) -> None:
        """The thread is ending (the lock is held): the next stream starts another."""
        self._thread = None
        if self._wake_fds is not None:
            for fd in self._wake_fds:
                os.close(fd)
            self._wake_fds = None

    def _read(self, subscribers: list[_Subscriber], now: float) -> bool:
        """Send each group of subscribers its next changes; whether any group has more."""
        groups: dict[tuple[str | None, Position], list[_Subscriber]] = {}
        for subscriber in subscribers:
            if subscriber.sink.backlog() < HIGH_WATER:
                groups.setdefault((subscriber.machine, subscriber.reached), []).append(subscriber)
        more = False
        try:
            with self._engine.connect() as conn:
                for (machine, reached), members in groups.items():
                    page = read_changes(
                        conn, reached, machine=machine, limit=PAGE, horizon=self._horizon
                    )
                    data = b"".join(encode(change) for change in page.changes)
                    if page.gap is not None:
                        data = encode_gap(page.gap) + data
                    for member in members:
                        if data:
                            member.sink.send(data)
                            member.last_sent = now
                        member.reached = page.reached
                    more = more or len(page.changes) >= PAGE
        except sa.exc.SQLAlchemyError as error:
            if not self._failing:
                logger.warning("changes streams cannot read the database: %s", error)
            self._failing = True
            return False
        if self._failing:
            logger.info("changes streams read the database again")
            self._failing = False
        return more

    def _heartbeat(self, subscribers: list[_Subscriber], now: float) -> None:
        for subscriber in subscribers:
            if now - subscriber.last_sent >= self._settings.stream_heartbeat:
                if not subscriber.sink.backlog():
                    subscriber.sink.send(HEARTBEAT)
                subscriber.last_sent = now

    @staticmethod
    def _watch_writes(selector: selectors.BaseSelector, subscribers: list[_Subscriber]) -> None:
        """Sockets with bytes waiting are watched for writability, the others only for EOF."""
        for subscriber in subscribers:
            sink = subscriber.sink
            if isinstance(sink, _SocketSink) and not sink.closed:
                wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if sink.backlog() else 0)
                if selector.get_key(sink).events != wanted:
                    selector.modify(sink, wanted)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
