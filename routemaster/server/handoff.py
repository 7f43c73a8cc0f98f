"""Taking a stream's connection away from the HTTP server, so no request worker waits on it.

Our gunicorn workers (:mod:`routemaster.server.workers`) hand each request's
socket to the application wrapped in a :class:`TakeableSocket`. When the
response is a changes stream that started well (200), :func:`call` writes
the response head itself, gives the socket to the stream hub, and returns
an empty body: gunicorn's worker goes straight on to the next request, and
whatever it still does with the connection (write a chunk terminator,
close it) reaches a socket it no longer owns, which ignores it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any, Protocol, runtime_checkable

from routemaster.hubs.changes import STREAM_KEY

WSGICall = Callable[[dict[str, Any], Any], Iterable[bytes]]

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "upgrade",
    "proxy-connection",
    "te",
    "trailer",
}


@runtime_checkable
class TakesSocket(Protocol):
    """What a view may leave under ``STREAM_KEY``: a changes stream, a waiting task claim."""

    def attach_socket(self, sock: socket.socket, head: bytes) -> None: ...


class TakeableSocket:
    """A client socket that a stream can take from the server in the middle of a request.

    Until taken, every attribute is the socket's. Once taken, the server's
    own reads, writes, timeouts and closing do nothing.
    """

    _INERT: dict[str, Any] = {
        "send": 0,
        "sendall": None,
        "sendfile": 0,
        "recv": b"",
        "recv_into": 0,
        "shutdown": None,
        "close": None,
        "setblocking": None,
        "settimeout": None,
    }

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.taken = False
        # The server's own calls, bound once: every request makes several, and a
        # lookup through __getattr__ each time cost a measurable share of a request.
        for name in self._INERT:
            setattr(self, name, getattr(sock, name))

    def take(self) -> socket.socket:
        self.taken = True
        for name, result in self._INERT.items():
            setattr(self, name, _returning(result))
        return self._sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _returning(result: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: result


def taking_streams(app: WSGICall) -> WSGICall:
    """``app`` as the server runs it: outermost, around any middleware a plugin added."""

    def serve(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return call(app, environ, start_response)

    return serve


def call(app: WSGICall, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """Run the WSGI ``app``; if it answered with a stream or waiting claim, take the connection."""
    connection = environ.get("gunicorn.socket")
    method = environ.get("REQUEST_METHOD")
    if not isinstance(connection, TakeableSocket) or method not in ("GET", "POST"):
        return app(environ, start_response)
    answered: list[tuple[str, list[tuple[str, str]]]] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answered[:] = [(status, headers)]
        return start_response(status, headers, exc_info)

    body = app(environ, capture)
    subscription = environ.get(STREAM_KEY)
    # Nearly every request leaves nothing: answered before the protocol check, which is
    # slow (isinstance against a runtime-checkable Protocol inspects its members each time).
    if subscription is None or not answered or not isinstance(subscription, TakesSocket):
        return body
    status, headers = answered[0]
    if not status.startswith("200"):
        return body
    close = getattr(body, "close", None)
    if close is not None:
        close()  # never iterated: the stream is served by the hub from here
    subscription.attach_socket(connection.take(), _head(status, headers))
    return []


def _head(status: str, headers: list[tuple[str, str]]) -> bytes:
    """Status line and headers; the body runs until the connection closes."""
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in _HOP_BY_HOP]
    lines += [f"Date: {formatdate(usegmt=True)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
