"""Gunicorn as ``routemaster serve`` runs it: request limits sized for the API, JSON errors.

A label name may be 1,024 characters of any script; percent-encoded, a
character can take 12 bytes (``%F0%9F%98%80``), so one name can make a
request line of over 12 KiB, and a listing's ``?after=NAME`` as much again.
Gunicorn's request-line limit is at most 8,190 bytes, or 0 for "no limit",
and with no limit its parser reads a line that never ends for as long as
the client sends it (copying all it has at every read). ``serve`` turns
gunicorn's limit off and its workers read request lines through
:class:`BoundedRequest`, which stops at :data:`REQUEST_LINE_LIMIT` (32 KiB:
room for a listing's path with two such names) with gunicorn's own
"request line too large" error, answered in JSON.

Requests gunicorn itself refuses (a malformed request line, too many or too
large header fields, a bad chunked encoding) never reach Flask; gunicorn
answers them with a small HTML page. The worker classes here answer them with
the same status in JSON, ``{"message": ...}`` saying what gunicorn found
wrong, like every other error of the API.

Gunicorn internals used here (its request parser's ``read_line`` and
``mesg_class``, gthread's ``pending_conns``, ``poller``,
``on_pending_socket_readable``, ``finish_request`` and the connection's
unread buffer, and for plain requests (:mod:`routemaster.server.plain`) its
``Response`` and ``wsgi.create``'s environ) are why ``pyproject.toml``
bounds gunicorn above to the releases CI tests.

They also let changes streams leave the worker: each client socket reaches
the application as a :class:`~routemaster.server.handoff.TakeableSocket`, so a
stream can take its connection to the process's stream thread and free the
worker for the next request (see :mod:`routemaster.server.handoff`). Without
TLS only: ``serve`` never terminates TLS itself (a proxy in front does).
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import selectors
import time
from datetime import datetime
from functools import partial
from typing import Any

from gunicorn import util
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.workers.gthread import DEFAULT_WORKER_DATA_TIMEOUT, TConn, ThreadWorker
from gunicorn.workers.sync import SyncWorker

from routemaster.server.handoff import TakeableSocket
from routemaster.server.plain import (
    OneWriteResponse,
    PlainRequest,
    base_of,
    plain_environ,
    plain_request,
)

REQUEST_LIMITS = {
    "limit_request_line": 0,  # gunicorn's off: BoundedRequest bounds it (module docstring)
    "limit_request_fields": 100,
    "limit_request_field_size": 16 * 1024,
}

REQUEST_LINE_LIMIT = 32 * 1024
"""The longest request line the workers read (see the module docstring)."""

PLAIN_READ = 64 * 1024
"""The most a keep-alive worker reads at once when a connection turns readable."""

_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3}) ([^\r\n]*)\r\n")


def worker_class(threads: int, *, keep_alive: bool = True) -> str:
    """The dotted name of the worker class for ``threads`` threads per worker.

    One thread: :class:`JsonErrorsKeepAlive` when connections are kept alive,
    else gunicorn's sync worker (one request per connection). More threads:
    gunicorn's gthread worker.
    """
    if threads > 1:
        name = "JsonErrorsThreaded"
    else:
        name = "JsonErrorsKeepAlive" if keep_alive else "JsonErrorsSync"
    return f"{__name__}.{name}"


class _Captured:
    """Stands in for the client socket while gunicorn writes its HTML error page."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def setblocking(self, flag: bool) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.data += data

    def send(self, data: bytes) -> int:
        self.data += data
        return len(data)


class _JsonErrors:
    """Mixed into gunicorn workers: their own error answers become JSON.

    Gunicorn's ``Worker.handle_error`` hook still decides the status and logs
    the error (and the access line); it writes its answer to a stand-in
    socket, from which only the HTTP status line is read. The message is the
    refused request's error itself (gunicorn's exceptions say what was wrong),
    or the reason phrase for a server error; gunicorn's HTML page is dropped.
    """

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        captured = _Captured()
        super().handle_error(req, captured, addr, exc)  # type: ignore[misc]
        status = _STATUS_LINE.match(captured.data)
        if status is None:  # gunicorn wrote nothing we recognise: pass it on as it was
            response = captured.data
        else:
            code, reason = status.group(1).decode(), status.group(2).decode("latin-1")
            message = str(exc) if code < "500" else ""
            response = json_error(code, reason, message or reason)
        with contextlib.suppress(OSError):  # the client may be gone
            util.write_nonblock(client, response)


def json_error(code: str, reason: str, message: str) -> bytes:
    body = json.dumps({"message": message}).encode()
    head = (
        f"HTTP/1.1 {code} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class BoundedRequest(Request):  # type: ignore[misc]
    """Gunicorn's request, reading a request line of at most :data:`REQUEST_LINE_LIMIT`."""

    def read_line(self, unreader: Any, buf: Any, limit: int = 0) -> Any:
        return super().read_line(unreader, buf, limit or REQUEST_LINE_LIMIT)


class BoundedConnection(TConn):  # type: ignore[misc]
    """A gthread connection whose HTTP/1 parser reads :class:`BoundedRequest` requests."""

    def init(self) -> None:
        super().init()
        if isinstance(self.parser, RequestParser) and self.parser.mesg_class is Request:
            self.parser.mesg_class = BoundedRequest


class JsonErrorsSync(_JsonErrors, SyncWorker):  # type: ignore[misc]
    """Gunicorn's sync worker, answering its own errors in JSON, streams handed off."""

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        if not self.cfg.is_ssl:
            client = TakeableSocket(client)
        super().handle(listener, client, addr)


class JsonErrorsThreaded(_JsonErrors, ThreadWorker):  # type: ignore[misc]
    """Gunicorn's gthread worker, answering its own errors in JSON, streams handed off,
    request lines bounded, and stopped quickly once however many signals ask."""

    _quitting = False

    def handle_quit(self, sig: int, frame: Any) -> None:
        """Gthread's quick stop, entered once.

        A worker sent Ctrl-C by a terminal and SIGQUIT by its master can take
        the second signal while the first handler holds the thread pool's
        shutdown lock; entered again, the handler waits on that lock for
        itself until the master kills it (30 s on). Signal handlers run on the
        main thread, one inside the other, so a flag is enough.
        """
        if self._quitting:
            return
        self._quitting = True
        super().handle_quit(sig, frame)

    def accept(self, listener: Any) -> None:
        """As gthread accepts, with the bounded connection."""
        conn = self._accepted(listener)
        if conn is not None:
            self.enqueue_req(conn)  # the connection sets its socket as gthread's does

    def _accepted(self, listener: Any) -> BoundedConnection | None:
        """The next client's connection; ``None`` if another worker took it first."""
        try:
            client, address = listener.accept()
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return None
        self.nr_conns += 1
        return BoundedConnection(self.cfg, client, address, listener.getsockname())

    def enqueue_req(self, conn: Any) -> None:
        if not self.cfg.is_ssl and not isinstance(conn.sock, TakeableSocket):
            conn.sock = TakeableSocket(conn.sock)
        super().enqueue_req(conn)

    def handle_request(self, req: Any, conn: Any) -> bool:
        keep_alive = bool(super().handle_request(req, conn))
        # A taken connection belongs to the stream: never back to keep-alive.
        return keep_alive and not (isinstance(conn.sock, TakeableSocket) and conn.sock.taken)


class _Done:
    """What gthread's ``finish_request`` reads of a request's outcome (in place of a future)."""

    __slots__ = ("_result",)

    def __init__(self, result: bool) -> None:
        self._result = result

    def cancelled(self) -> bool:
        return False

    def result(self) -> bool:
        return self._result


class JsonErrorsKeepAlive(JsonErrorsThreaded):
    """Gunicorn's gthread worker with one thread, minus the thread: requests answered inline.

    gthread keeps clients' connections alive on a poller and hands each
    request to its thread pool, which hands the connection back through a
    wake-up pipe: with one thread, two thread switches per request for
    nothing (a sixth of the worker's CPU per request, docs/performance.md).
    This worker answers each request on the polling thread itself, as the
    sync worker does (so gunicorn's worker timeout still ends a request that
    hangs), while keeping connections alive as gthread does. A new
    connection waits on the poller for its first bytes (up to the keep-alive
    time plus gthread's own wait), so a client that connects and sends
    nothing holds no one up.

    A plain request (:mod:`routemaster.server.plain`: whole in what was
    received, no chunked body, no expectation, no proxy scheme headers) is
    read and answered here without gunicorn's parser, its response head and
    body sent in one write; any other goes through gunicorn's parser and
    request handling unchanged.
    """

    _plain_base: dict[str, Any] | None = None
    alive: bool  # gunicorn's Worker: False once told to stop

    def accept(self, listener: Any) -> None:
        conn = self._accepted(listener)
        if conn is None:
            return
        conn.timeout = time.monotonic() + self.cfg.keepalive + DEFAULT_WORKER_DATA_TIMEOUT
        self.pending_conns.append(conn)
        self.poller.register(
            conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn)
        )

    def enqueue_req(self, conn: Any) -> None:
        """Answer the request now, and those the client already sent behind it."""
        if not self.cfg.is_ssl and not isinstance(conn.sock, TakeableSocket):
            conn.sock = TakeableSocket(conn.sock)
        while True:
            keep_alive = self._serve(conn)
            if keep_alive and conn.parser.unreader.buf.getvalue():
                continue
            self.finish_request(conn, _Done(keep_alive))
            return

    def _serve(self, conn: Any) -> bool:
        """One request of ``conn`` (readable, or with bytes read ahead); whether to keep it."""
        cfg = self.cfg
        if cfg.is_ssl or cfg.proxy_protocol != "off" or not isinstance(conn.client, tuple):
            return bool(self.handle(conn))
        conn.init()
        if conn.is_http2:
            return bool(self.handle(conn))
        unreader = conn.parser.unreader
        data = unreader.take_buffered()
        if not data:
            try:
                data = conn.sock.recv(PLAIN_READ)
            except OSError as error:
                self.log.debug("Ignoring socket error before a request: %s", error)
                return False
            if not data:
                return False  # the client closed its connection
        found = plain_request(data, self.cfg, REQUEST_LINE_LIMIT)
        if found is None:
            unreader.unread(data)
            return bool(self.handle(conn))
        request, end = found
        if end < len(data):
            unreader.unread(data[end:])
        # Between requests the socket waits on the poller unblocked; a response's writes block.
        conn.sock.setblocking(True)
        try:
            return self._answer_plain(request, conn)
        except StopIteration:
            return False
        except OSError as error:
            if error.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
            else:
                self.log.debug("Ignoring socket error: %s", error)
            return False
        except Exception as error:
            self.handle_error(request, conn.sock, conn.client, error)
            return False

    def _answer_plain(self, request: PlainRequest, conn: Any) -> bool:
        """gthread's ``handle_request`` for a plain request: the same hooks, limits and logs."""
        if self._plain_base is None:
            self._plain_base = base_of(self.cfg)
        environ: dict[str, Any] = {}
        response = None
        try:
            self.cfg.pre_request(self, request)
            request_start = datetime.now()
            response = OneWriteResponse(request, conn.sock, self.cfg)
            environ = plain_environ(self._plain_base, request, conn.sock, conn.client, conn.server)
            self.nr += 1
            if self.nr >= self.max_requests:
                if self.alive:
                    self.log.info("Autorestarting worker after current request.")
                    self.alive = False
                response.force_close()
            crowded = len(self.keepalived_conns) >= self.max_keepalived
            if not self.alive or not self.cfg.keepalive or crowded:
                response.force_close()
            body = self.wsgi(environ, response.start_response)
            try:
                for item in body:
                    response.write(item)
                response.close()
            finally:
                self.log.access(response, request, environ, datetime.now() - request_start)
                close = getattr(body, "close", None)
                if close is not None:
                    close()
            if response.should_close():
                return False
        except OSError:
            raise
        except (Exception, SystemExit):
            if response is not None and response.headers_sent:
                self.log.exception("Error handling request")
                util.close_graceful(conn.sock)
                raise StopIteration() from None
            raise
        finally:
            try:
                self.cfg.post_request(self, request, environ, response)
            except Exception:
                self.log.exception("Exception in post_request hook")
        # A taken connection belongs to the stream: never back to keep-alive.
        return not (isinstance(conn.sock, TakeableSocket) and conn.sock.taken)
