"""Outbound requests with a total deadline and a cap on what is read back.

``requests`` bounds each socket operation, not a request: a receiver that
drips a byte a second never trips a 2 s read timeout. Here every request
has one deadline for everything (connecting, sending, the status line and
headers, the body); each read from the socket is given only the time left,
so a slow receiver costs its caller at most the deadline. At most
``max_response_bytes`` of the body are read (asked for as ``identity``, and
counted after any decoding); past that the connection is dropped instead of
read to its end.

The deadline reaches the socket reads through the session's
:class:`BoundedAdapter`, whose connections read through a
:class:`_DeadlineReader`. A session with a plain adapter mounted (say one
sized for the worker's pool) has it swapped for a bounded one of the same
size on first use, so no caller can lose the bound by accident.

The request URL is sent as rendered: a ``%2E`` segment (a label ``.`` or
``..``) is not turned back into a dot segment for the server to resolve.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import requests.adapters
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from routemaster import __version__

USER_AGENT = f"routemaster/{__version__}"
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
_CHUNK = 64 * 1024


class OutboundError(Exception):
    """No usable answer (network error, deadline, refused URL); the message says which."""


class OutboundTimeout(OutboundError):
    """The deadline passed before a complete answer came."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # case-insensitive
    body: bytes  # at most the cap
    complete: bool  # False: the body was longer than the cap and was cut off


def outbound_session() -> requests.Session:
    """The keep-alive session for webhooks and feeds, with bounded adapters.

    ``trust_env`` is off: reading ``~/.netrc`` and the proxy variables on
    every request was a fifth of a delivery's cost, and webhook receivers are
    addressed directly.
    """
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", BoundedAdapter())
    session.mount("https://", BoundedAdapter())
    return session


def send(
    session: requests.Session,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | None = None,
    deadline: float,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> Answer:
    """One request, answered (any status) by ``deadline`` (a ``time.monotonic()`` value).

    Raises :class:`OutboundError` for anything that is not an answer: no
    connection, the deadline passing (at any stage), a malformed response.
    Redirects are never followed here.
    """
    started = time.monotonic()
    if deadline <= started:
        raise OutboundError(f"{method} {url}: no time left before the deadline")
    prepared = requests.PreparedRequest()
    try:
        prepared.prepare(
            method=method,
            url=url,
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers},
            data=body,
        )
    except (requests.RequestException, ValueError) as error:
        raise OutboundError(f"{method} {url}: not a usable URL: {error}") from None
    prepared.url = _keep_escaped_dot_segments(prepared.url or url)
    adapter = bounded_adapter(session, prepared.url)
    try:
        with adapter.deadline(deadline):
            response = adapter.send(prepared, stream=True, timeout=deadline - started)
        try:
            data, complete = _read_capped(response.raw, max_response_bytes)
        except BaseException:
            response.close()  # a half-read connection cannot be reused
            raise
        if not complete:
            response.close()  # not read to its end: drop the connection, do not pool it
    except (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError):
        raise OutboundTimeout(
            f"{method} {url} timed out: no complete answer within "
            f"{deadline - started:.3g} s (the total deadline)"
        ) from None
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        raise OutboundError(f"{method} {url} failed: {type(error).__name__}: {error}") from None
    return Answer(response.status_code, response.headers, data, complete)


def bounded_adapter(session: requests.Session, url: str) -> BoundedAdapter:
    """The session's adapter for ``url``, swapped for a bounded one if it is plain."""
    adapter = session.get_adapter(url)
    if isinstance(adapter, BoundedAdapter):
        return adapter
    bounded = BoundedAdapter(
        pool_connections=getattr(adapter, "_pool_connections", requests.adapters.DEFAULT_POOLSIZE),
        pool_maxsize=getattr(adapter, "_pool_maxsize", requests.adapters.DEFAULT_POOLSIZE),
        pool_block=getattr(adapter, "_pool_block", requests.adapters.DEFAULT_POOLBLOCK),
    )
    for prefix, mounted in list(session.adapters.items()):
        if mounted is adapter:
            session.mount(prefix, bounded)
    adapter.close()
    return bounded


class _Deadline(threading.local):
    """The deadline of the request this thread is sending through one adapter."""

    at: float | None = None


class BoundedAdapter(requests.adapters.HTTPAdapter):
    """An adapter whose connections read under the deadline set by :meth:`deadline`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._deadline = _Deadline()
        super().__init__(*args, **kwargs)

    @contextlib.contextmanager
    def deadline(self, at: float) -> Iterator[None]:
        self._deadline.at = at
        try:
            yield
        finally:
            self._deadline.at = None

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        state = {"deadline_state": self._deadline}
        plain = type("DeadlineHTTPConnection", (_DeadlineConnection, HTTPConnection), state)
        secure = type("DeadlineHTTPSConnection", (_DeadlineConnection, HTTPSConnection), state)
        self.poolmanager.pool_classes_by_scheme = {
            "http": type("DeadlinePool", (HTTPConnectionPool,), {"ConnectionCls": plain}),
            "https": type("DeadlineSecurePool", (HTTPSConnectionPool,), {"ConnectionCls": secure}),
        }


class _DeadlineConnection:
    """Mixed into urllib3's connections: the response reads under the current deadline."""

    deadline_state: _Deadline

    def getresponse(self) -> Any:
        at = self.deadline_state.at
        self.response_class = (  # read by http.client when it builds the response
            functools.partial(_DeadlineResponse, deadline=at)
            if at is not None
            else http.client.HTTPResponse
        )
        return super().getresponse()  # type: ignore[misc]


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(_DeadlineReader(self.fp.detach(), sock, deadline))


class _DeadlineReader(io.RawIOBase):
    """A socket reader that gives each read only the time left before the deadline."""

    def __init__(self, raw: Any, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._raw = raw
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the total deadline passed")
        self._sock.settimeout(remaining)
        result: int | None = self._raw.readinto(buffer)
        return result

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _read_capped(raw: Any, cap: int) -> tuple[bytes, bool]:
    """Up to ``cap`` bytes of the body, and whether that was all of it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = raw.read(min(_CHUNK, cap + 1 - size), decode_content=True)
        if not chunk:
            return b"".join(chunks), True
        size += len(chunk)
        chunks.append(chunk)
        if size > cap:
            return b"".join(chunks)[:cap], False


def _keep_escaped_dot_segments(url: str) -> str:
    """Write ``.``/``..`` path segments back as ``%2E`` after ``requests`` unquoted them.

    A literal dot segment in a configured URL is already resolved by URL
    parsing, so any left here came from an escaped name and must stay escaped.
    """
    parts = urlsplit(url)
    segments = parts.path.split("/")
    if not any(segment in (".", "..") for segment in segments):
        return url
    path = "/".join(
        segment.replace(".", "%2E") if segment in (".", "..") else segment for segment in segments
    )
    return urlunsplit(parts._replace(path=path))
