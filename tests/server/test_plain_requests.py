"""Plain requests: read without gunicorn's parser, to the environ gunicorn's own path builds.

Each request here goes both ways over the same bytes: gunicorn's parser and
``wsgi.create`` (as the worker used to serve every request), and
:func:`plain_request` with :func:`plain_environ`. The environs must be equal
key for key; requests that are not plain must be left to gunicorn.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser

from routemaster.server.application import GunicornServer
from routemaster.server.plain import (
    OneWriteResponse,
    base_of,
    plain_environ,
    plain_request,
)
from routemaster.server.workers import REQUEST_LIMITS, REQUEST_LINE_LIMIT, BoundedRequest

CLIENT = ("127.0.0.1", 40123)
SERVER = ("127.0.0.1", 2017)
# Compared by what they do, not by identity: each side makes its own.
OBJECTS = ("wsgi.input", "wsgi.errors", "gunicorn.socket")
# Left out of a plain request's environ: nothing in the service sends 103 Early Hints.
NOT_GIVEN = {"wsgi.early_hints"}


def _cfg() -> Any:
    server = GunicornServer({"workers": 4, **REQUEST_LIMITS}, lambda: None)  # type: ignore[arg-type,return-value]
    return server.cfg


def _gunicorn(cfg: Any, data: bytes) -> tuple[dict[str, Any], bytes]:
    parser = RequestParser(cfg, iter([data]), CLIENT)
    parser.mesg_class = BoundedRequest
    request = next(parser)
    _, environ = wsgi.create(request, object(), CLIENT, SERVER, cfg)
    environ["wsgi.multithread"] = True
    return environ, environ["wsgi.input"].read()


def _plain(cfg: Any, data: bytes) -> tuple[dict[str, Any], bytes, int]:
    found = plain_request(data, cfg, REQUEST_LINE_LIMIT)
    assert found is not None
    request, end = found
    sock = object()
    environ = plain_environ(base_of(cfg), request, sock, CLIENT, SERVER)
    return environ, environ["wsgi.input"].read(), end


PLAIN = [
    b"GET /state-machines/flow/labels/r-1 HTTP/1.1\r\nHost: 127.0.0.1:2017\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET /state-machines/flow/labels/%C3%A9t%C3%A9%20x?after=a%2Fb&limit=10 HTTP/1.1\r\n"
    b"Host: h\r\nAccept: application/json\r\nAccept: text/plain\r\n"
    b"Authorization: Bearer abc.def\r\nX-Thing:   padded value \t\r\n\r\n",
    b"POST /state-machines/flow/labels/a HTTP/1.1\r\nHost: h\r\n"
    b"Content-Type: application/json\r\nContent-Length: 17\r\n\r\n"
    b'{"metadata": {}} ',
    b"PATCH /x HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    b"DELETE /state-machines/flow/labels/a?x HTTP/1.1\r\nHost: h\r\nCookie: \xe9\r\n\r\n",
    b"HEAD /metrics? HTTP/1.1\r\nhost: lower\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n",
]


@pytest.mark.parametrize("data", PLAIN)
def test_a_plain_request_has_the_environ_gunicorn_gives_it(data: bytes) -> None:
    cfg = _cfg()
    expected, expected_body = _gunicorn(cfg, data)
    environ, body, end = _plain(cfg, data)
    assert body == expected_body
    assert end == len(data)
    assert set(environ) == set(expected) - NOT_GIVEN
    assert {k: v for k, v in environ.items() if k not in OBJECTS} == {
        k: v for k, v in expected.items() if k not in OBJECTS and k not in NOT_GIVEN
    }


def test_a_plain_request_ends_where_the_next_one_starts() -> None:
    first = b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    found = plain_request(first + b"GET /b HTTP/1.1\r\n\r\n", _cfg(), REQUEST_LINE_LIMIT)
    assert found is not None and found[1] == len(first)


NOT_PLAIN = [
    b"GET /a HTTP/1.1\r\nHost: h\r\n",  # the head is not all here
    b"POST /a HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}",  # nor the body
    b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
    b"GET /a HTTP/1.1\r\nX-Forwarded-Proto: https\r\n\r\n",
    b"GET /a HTTP/1.1\r\nX_Odd: 1\r\n\r\n",
    b"GET /a HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET /a HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
    b"GET /a HTTP/1.1\r\nFolded: a\r\n b\r\n\r\n",
    b"GET /a HTTP/1.1\r\nBad Name: a\r\n\r\n",
    b"GET /a#frag HTTP/1.1\r\n\r\n",
    b"GET //a HTTP/1.1\r\n\r\n",
    b"GET http://h/a HTTP/1.1\r\n\r\n",
    b"BREW /a HTTP/1.1\r\n\r\n",
    b"GET /a HTTP/2.0\r\n\r\n",
    b"\r\nGET /a HTTP/1.1\r\n\r\n",
    b"GET /a HTTP/1.1\r\nX: " + b"y" * (16 * 1024) + b"\r\n\r\n",
    b"GET /a HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n",
]


@pytest.mark.parametrize("data", NOT_PLAIN)
def test_anything_else_is_left_to_gunicorn(data: bytes) -> None:
    assert plain_request(data, _cfg(), REQUEST_LINE_LIMIT) is None


class _Socket:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(data)


def _respond(method: str, status: str, headers: list[tuple[str, str]], body: list[bytes]) -> Any:
    data = f"{method} /a HTTP/1.1\r\nHost: h\r\n\r\n".encode()
    found = plain_request(data, _cfg(), REQUEST_LINE_LIMIT)
    assert found is not None
    sock = _Socket()
    response = OneWriteResponse(found[0], sock, _cfg())
    response.start_response(status, headers)
    for piece in body:
        response.write(piece)
    response.close()
    return sock.writes


def test_a_response_with_its_length_is_one_write() -> None:
    (write,) = _respond("GET", "200 OK", [("Content-Length", "2")], [b"{}"])
    assert write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b"\r\n\r\n{}")
    assert b"Connection: keep-alive\r\n" in write
    assert b"\r\nServer: gunicorn\r\nDate: " in write and b" GMT\r\n" in write


def test_a_streamed_response_is_chunked_its_head_with_the_first_piece() -> None:
    writes = _respond("GET", "200 OK", [], [b"[", b"]"])
    assert len(writes) == 3
    assert b"Transfer-Encoding: chunked\r\n" in writes[0] and writes[0].endswith(b"\r\n1\r\n[\r\n")
    assert writes[1:] == [b"1\r\n]\r\n", b"0\r\n\r\n"]


def test_an_empty_streamed_response_still_ends() -> None:
    (write,) = _respond("GET", "200 OK", [], [])
    assert write.endswith(b"\r\n\r\n0\r\n\r\n")


def test_a_head_response_has_no_body() -> None:
    (write,) = _respond("HEAD", "200 OK", [("Content-Length", "2")], [b"{}"])
    assert write.endswith(b"\r\n\r\n") and b"Content-Length: 2\r\n" in write


def test_the_input_is_the_body() -> None:
    data = b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
    environ, body, _ = _plain(_cfg(), data)
    assert body == b"abc" and isinstance(environ["wsgi.input"], io.BytesIO)
