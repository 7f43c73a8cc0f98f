"""Plain requests read in one step: the keep-alive worker's short way past gunicorn's parser.

Nearly every request the API gets is plain: a request line, a dozen header
fields or fewer, and no body or a small one whose length is given, all in
the bytes one ``recv`` returned. Gunicorn's parser reads such a request
through its unreader, then builds the WSGI environ in a second pass; at
about 0.5 ms of serve CPU per read of a label, that was a fifth of it
(docs/performance.md, reads against 1.5.0). :func:`plain_request` reads a
plain request from bytes already received, and :func:`plain_environ`
builds the environ gunicorn's ``wsgi.create`` would for it (equal key for
key: ``tests/server/test_plain_requests.py`` holds them side by side).

Anything else is not plain, and :func:`plain_request` answers ``None``: a
head not yet whole, a body not yet all here, a chunked or ``Expect`` request,
scheme headers a proxy sets, header names with ``_``, an ``Upgrade``, field
counts or sizes past the limits, anything malformed. The worker then hands
the same bytes to gunicorn's own parser, which serves the request or
refuses it exactly as before; so every error answer stays gunicorn's
(in JSON, :mod:`routemaster.server.workers`).
"""

from __future__ import annotations

import functools
import io
import re
import time
from typing import Any

from gunicorn import util
from gunicorn.http.wsgi import Response, base_environ

PLAIN_HEAD_LIMIT = 16 * 1024
"""The longest head read here; a longer one goes to gunicorn's parser."""

_REQUEST_LINE = re.compile(r"(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) (/[!-~]*) HTTP/1\.([01])")
# Header fields, each a token (RFC 9110 5.6.2) without "_", then a value without NUL, CR or LF.
_FIELD = r"[!#$%&'*+\-.^`|~0-9A-Za-z]+:[^\x00\r\n]*"
_FIELDS = re.compile(f"{_FIELD}(?:\r\n{_FIELD})*")
# Fields gunicorn reads for more than their value: framing, expectations,
# the scheme a trusted proxy sets, protocol upgrades.
_NOT_PLAIN = frozenset(
    (
        "TRANSFER-ENCODING",
        "EXPECT",
        "UPGRADE",
        "HTTP2-SETTINGS",
        "X-FORWARDED-PROTOCOL",
        "X-FORWARDED-PROTO",
        "X-FORWARDED-SSL",
    )
)
_SINGLE = frozenset(("HOST", "CONTENT-TYPE", "CONTENT-LENGTH"))


class PlainRequest:
    """A plain request, with what gunicorn's response, logs and hooks read of its request."""

    __slots__ = ("body", "fragment", "headers", "method", "path", "query", "uri", "version")

    def __init__(
        self,
        method: str,
        uri: str,
        version: tuple[int, int],
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        self.method = method
        self.uri = uri
        self.path, _, self.query = uri.partition("?")
        self.fragment = ""
        self.version = version
        self.headers = headers
        self.body = body

    def should_close(self) -> bool:
        """As gunicorn's request decides it: its first ``Connection`` field, else the version."""
        for name, value in self.headers:
            if name == "CONNECTION":
                value = value.lower().strip(" \t")
                if value == "close":
                    return True
                if value == "keep-alive":
                    return False
                break
        return self.version <= (1, 0)


def plain_request(data: bytes, cfg: Any, line_limit: int) -> tuple[PlainRequest, int] | None:
    """The plain request at the start of ``data`` and where it ends; ``None`` if not plain."""
    head_end = data.find(b"\r\n\r\n", 0, PLAIN_HEAD_LIMIT)
    if head_end < 0:
        return None
    line, _, fields = data[:head_end].decode("latin-1").partition("\r\n")
    first = _REQUEST_LINE.fullmatch(line)
    if first is None or len(line) > line_limit:
        return None
    method, target, minor = first.groups()
    if "#" in target or target.startswith("//"):
        return None
    headers: list[tuple[str, str]] = []
    length = 0
    if fields:
        if _FIELDS.fullmatch(fields) is None:
            return None
        lines = fields.split("\r\n")
        if len(lines) > cfg.limit_request_fields:
            return None
        field_limit = cfg.limit_request_field_size
        if len(fields) + 2 > field_limit > 0 and any(len(f) + 2 > field_limit for f in lines):
            return None
        seen: set[str] = set()
        for each in lines:
            name, _, value = each.partition(":")
            name = name.upper()
            value = value.strip(" \t")
            if name in _NOT_PLAIN:
                return None
            if name in _SINGLE:
                if name in seen:
                    return None
                seen.add(name)
                if name == "CONTENT-LENGTH":
                    if not value.isdigit() or not value.isascii():
                        return None
                    length = int(value)
            headers.append((name, value))
    end = head_end + 4 + length
    if len(data) < end:
        return None
    body = data[head_end + 4 : end]
    return PlainRequest(method, target, (1, int(minor)), headers, body), end


def base_of(cfg: Any) -> dict[str, Any]:
    """The part of every environ that depends on the configuration only (once per worker)."""
    environ: dict[str, Any] = base_environ(cfg)
    environ["wsgi.url_scheme"] = "http"
    environ["SCRIPT_NAME"] = ""
    environ["wsgi.multithread"] = True  # as gunicorn's gthread worker says
    return environ


def plain_environ(
    base: dict[str, Any],
    request: PlainRequest,
    sock: Any,
    client: Any,
    server: Any,
) -> dict[str, Any]:
    """The environ gunicorn builds for ``request`` (``wsgi.create``), over a TCP listener.

    Without ``wsgi.early_hints``: nothing in the service sends 103 Early Hints.
    """
    environ = base.copy()
    environ["wsgi.input"] = io.BytesIO(request.body)
    environ["gunicorn.socket"] = sock
    environ["REQUEST_METHOD"] = request.method
    environ["QUERY_STRING"] = request.query
    environ["RAW_URI"] = request.uri
    environ["SERVER_PROTOCOL"] = f"HTTP/1.{request.version[1]}"
    repeated: dict[str, list[str]] = {}
    for name, value in request.headers:
        if name == "CONTENT-TYPE":
            environ["CONTENT_TYPE"] = value
            continue
        if name == "CONTENT-LENGTH":
            environ["CONTENT_LENGTH"] = value
            continue
        key = "HTTP_" + name.replace("-", "_")
        if key in environ:
            repeated.setdefault(key, [environ[key]]).append(value)
        else:
            environ[key] = value
    for key, values in repeated.items():
        environ[key] = ",".join(values)
    environ["REMOTE_ADDR"] = client[0]
    environ["REMOTE_PORT"] = str(client[1])
    environ["SERVER_NAME"] = server[0]
    environ["SERVER_PORT"] = str(server[1])
    environ["PATH_INFO"] = util.unquote_to_wsgi_str(request.path)
    return environ


def _date() -> str:
    """The ``Date`` field's value now, as gunicorn writes it, formatted once a second."""
    return _date_at(int(time.time()))


@functools.lru_cache(maxsize=1)
def _date_at(second: int) -> str:
    return str(util.http_date(second))


class OneWriteResponse(Response):  # type: ignore[misc]
    """Gunicorn's response, its head sent with the first piece of the body: one write, not two.

    Every rule of the response (framing, hop-by-hop fields, bodies a ``HEAD``
    or 204 must not have, ``Connection``) stays gunicorn's; only the head is
    held back until the body's first bytes (or the end) go out with it.
    """

    _head = b""
    headers_sent: bool

    def default_headers(self) -> list[str]:
        """Gunicorn's own (``Response.default_headers``), the date formatted once a second."""
        if self.upgrade:
            connection = "upgrade"
        elif self.should_close():
            connection = "close"
        else:
            connection = "keep-alive"
        major, minor = self.req.version
        headers = [
            f"HTTP/{major}.{minor} {self.status}\r\n",
            f"Server: {self.version}\r\n",
            f"Date: {_date()}\r\n",
            f"Connection: {connection}\r\n",
        ]
        if self.chunked:
            headers.append("Transfer-Encoding: chunked\r\n")
        return headers

    def send_headers(self) -> None:
        if self.headers_sent:
            return
        lines = self.default_headers()
        lines.extend([f"{name}: {value}\r\n" for name, value in self.headers])
        self._head = ("".join(lines) + "\r\n").encode("latin-1")
        self.headers_sent = True

    def _emit_body(self, data: bytes) -> None:
        head, self._head = self._head, b""
        if self.chunked:
            data = b"%X\r\n%s\r\n" % (len(data), data)
        self.sock.sendall(head + data)

    def close(self) -> None:
        if not self.headers_sent:
            self.send_headers()
        head, self._head = self._head, b""
        ending = head + b"0\r\n\r\n" if self.chunked else head
        if ending:
            self.sock.sendall(ending)

    def can_sendfile(self) -> bool:
        return False  # sendfile would write its head itself: a file goes out as its pieces
