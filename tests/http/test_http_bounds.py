"""Outbound HTTP is bounded: total deadline, response cap, redirects, whose secrets go where."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import unquote

import pytest
import requests

from routemaster.config.model import Action, Feed, NoNext, StateMachine, WebhookHeaderRule
from routemaster.exit_conditions.context import FeedUnavailable
from routemaster.http.client import OutboundError, outbound_session, send
from routemaster.http.feeds import fetch_feed
from routemaster.http.webhooks import Outcome, build_request, deliver
from tests.stub_server import Reply, StubServer, running_stub

SECRET = ("Authorization", "Bearer s3cret")


class RawServer:
    """A TCP server on 127.0.0.1 answering each connection with ``handle(socket)``."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.handle = handle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.sent = 0  # bytes the handler managed to send
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        self.listener.settimeout(0.05)
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._one, args=(client,), daemon=True).start()

    def _one(self, client: socket.socket) -> None:
        # The client hanging up (as a bounded one does) ends the handler.
        with client, contextlib.suppress(OSError):
            client.recv(65536)  # the request (small, one read)
            self.handle(client)

    def send(self, client: socket.socket, data: bytes) -> None:
        client.sendall(data)
        self.sent += len(data)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.listener.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[RawServer, socket.socket], None]], RawServer]]:
    servers: list[RawServer] = []

    def start(handle: Callable[[RawServer, socket.socket], None]) -> RawServer:
        server = RawServer(lambda client: handle(server, client))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from running_stub()


@pytest.fixture
def other() -> Iterator[StubServer]:
    yield from running_stub()


def drip_headers(server: RawServer, client: socket.socket) -> None:
    """A valid response whose status line and headers arrive one byte every 0.1 s."""
    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Padding: " + b"x" * 200:
        server.send(client, bytes([byte]))
        time.sleep(0.1)


def drip_body(server: RawServer, client: socket.socket) -> None:
    """Headers at once, then a long body one byte every 0.1 s."""
    server.send(client, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        server.send(client, b"x")
        time.sleep(0.1)


@pytest.mark.parametrize("handler", [drip_headers, drip_body], ids=["headers", "body"])
def test_a_dripping_receiver_costs_at_most_the_total_deadline(
    raw_server: Callable[..., RawServer], handler: Callable[[RawServer, socket.socket], None]
) -> None:
    server = raw_server(handler)
    started = time.monotonic()
    with pytest.raises(OutboundError, match="timed out"):
        send(outbound_session(), "GET", server.url("/"), headers={}, deadline=started + 1.0)
    elapsed = time.monotonic() - started
    # Per-read timeouts would wait for the whole drip (20 s and 100 s); the margin
    # over the 1 s deadline only absorbs a loaded machine.
    assert elapsed < 10, elapsed
    assert server.sent > 3  # it really was dripping when we gave up


def test_webhook_timeout_is_total_not_per_read(raw_server: Callable[..., RawServer]) -> None:
    server = raw_server(drip_body)
    machine = StateMachine(
        name="m", states=(Action("a", server.url("/hook"), NoNext()),), webhooks=()
    )
    request = build_request(machine, machine.states[0], "l", {}, token="1", timestamp=0)  # type: ignore[arg-type]
    started = time.monotonic()
    result = deliver(outbound_session(), request, timeout=0.8)
    assert result.outcome is Outcome.FAILED
    assert result.error is not None and "timed out" in result.error
    assert time.monotonic() - started < 10  # the drip lasts 100 s


def huge_answer(server: RawServer, client: socket.socket) -> None:
    """50 MiB of body, as fast as the client takes it."""
    size = 50 * 1024 * 1024
    server.send(client, f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
    chunk = b"[" * 65536
    for _ in range(size // len(chunk)):
        server.send(client, chunk)


def test_a_huge_answer_is_read_up_to_the_cap_and_dropped(
    raw_server: Callable[..., RawServer],
) -> None:
    server = raw_server(huge_answer)
    answer = send(
        outbound_session(),
        "GET",
        server.url("/"),
        headers={},
        deadline=time.monotonic() + 10,
        max_response_bytes=100_000,
    )
    assert answer.status == 200
    assert (len(answer.body), answer.complete) == (100_000, False)
    assert server.sent < 50 * 1024 * 1024


def feed_machine(url: str, *rules: WebhookHeaderRule) -> StateMachine:
    return StateMachine(name="m", states=(), feeds=(Feed("f", url),), webhooks=rules)


def test_a_feed_answer_over_the_cap_is_a_failed_feed(raw_server: Callable[..., RawServer]) -> None:
    server = raw_server(huge_answer)
    with pytest.raises(FeedUnavailable, match="more than 1000 bytes"):
        fetch_feed(
            outbound_session(),
            feed_machine(server.url("/<label>")),
            "f",
            "x",
            timeout=5,
            max_response_bytes=1000,
        )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than the limit of 128 levels"),
        (json.dumps({"a": [[[[[1]]]]]}).encode(), "nested deeper than the limit of 3 levels"),
        (b"<html>not json</html>", "not valid JSON"),
        (b'{"a": NaN}', "not valid JSON"),
    ],
)
def test_unusable_feed_json_is_a_failed_feed(stub: StubServer, body: bytes, problem: str) -> None:
    stub.script("/f/x", Reply(200, body))
    depth = 3 if b"[[[[[1" in body else 128
    with pytest.raises(FeedUnavailable, match=problem):
        fetch_feed(
            outbound_session(),
            feed_machine(stub.url("/f/<label>")),
            "f",
            "x",
            timeout=5,
            max_depth=depth,
        )


def test_header_rules_match_the_template_not_the_label(stub: StubServer) -> None:
    rule = WebhookHeaderRule(match=r"hooks\.example\.com", headers=(SECRET,))
    machine = feed_machine(stub.url("/f/<label>"), rule)
    stub.reply_json("/f/hooks.example.com-x", {"ok": True})
    fetch_feed(outbound_session(), machine, "f", "hooks.example.com-x", timeout=5)
    action = Action("notify", stub.url("/hooks/<label>"), NoNext())
    webhook_machine = StateMachine(name="m", states=(action,), webhooks=(rule,))
    request = build_request(
        webhook_machine, action, "hooks.example.com", {}, token="1", timestamp=0
    )
    assert deliver(outbound_session(), request, timeout=5).outcome is Outcome.DELIVERED
    assert [r.headers.get("Authorization") for r in stub.received()] == [None, None]


def test_a_redirect_to_another_origin_never_carries_the_secret(
    stub: StubServer, other: StubServer
) -> None:
    rule = WebhookHeaderRule(match=r"/feeds/", headers=(SECRET,))
    machine = feed_machine(stub.url("/feeds/<label>"), rule)
    stub.script("/feeds/x", Reply(302, headers=(("Location", stub.url("/feeds/moved")),)))
    stub.script("/feeds/moved", Reply(307, headers=(("Location", other.url("/elsewhere")),)))
    other.reply_json("/elsewhere", {"v": 1})
    assert fetch_feed(outbound_session(), machine, "f", "x", timeout=5) == {"v": 1}
    # Same origin: the secret follows. Another origin: it does not.
    assert [r.headers.get("Authorization") for r in stub.received()] == [SECRET[1]] * 2
    [elsewhere] = other.received()
    assert "Authorization" not in elsewhere.headers


def test_too_many_redirects_is_a_failed_feed(stub: StubServer) -> None:
    stub.script("/loop", Reply(302, headers=(("Location", "/loop"),)))
    with pytest.raises(FeedUnavailable, match="over 5 redirects"):
        fetch_feed(outbound_session(), feed_machine(stub.url("/loop")), "f", "x", timeout=5)


def test_a_webhook_redirect_is_not_followed(stub: StubServer, other: StubServer) -> None:
    stub.script("/hook", Reply(308, headers=(("Location", other.url("/stolen")),)))
    action = Action("notify", stub.url("/hook"), NoNext())
    machine = StateMachine(
        name="m", states=(action,), webhooks=(WebhookHeaderRule(".", (SECRET,)),)
    )
    result = deliver(
        outbound_session(),
        build_request(machine, action, "l", {}, token="1", timestamp=0),
        timeout=5,
    )
    assert result.outcome is Outcome.FAILED
    assert result.error is not None and "redirects are not followed" in result.error
    assert other.received() == []


@pytest.mark.parametrize("label", [".", "..", "...", "a/../b", "%2E%2E", "./."])
def test_a_label_is_always_exactly_one_path_segment(stub: StubServer, label: str) -> None:
    action = Action("notify", stub.url("/hooks/<label>/notify"), NoNext())
    machine = StateMachine(name="m", states=(action,))
    request = build_request(machine, action, label, {}, token="1", timestamp=0)
    assert deliver(outbound_session(), request, timeout=5).outcome is Outcome.DELIVERED
    [received] = stub.received()
    segments = received.path.split("/")
    assert len(segments) == 4 and segments[1] == "hooks" and segments[3] == "notify"
    assert unquote(segments[2]) == label


def test_a_plain_session_gets_the_bound_too(raw_server: Callable[..., RawServer]) -> None:
    server = raw_server(drip_body)
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=3))
    started = time.monotonic()
    with pytest.raises(OutboundError, match="timed out"):
        send(session, "GET", server.url("/"), headers={}, deadline=started + 0.5)
    assert time.monotonic() - started < 10  # the drip lasts 100 s
