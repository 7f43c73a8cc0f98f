import base64
import hashlib
import hmac
import json

import pytest
import requests

from routemaster.config.model import Action, NoNext, StateMachine, WebhookHeaderRule
from routemaster.http.webhooks import Outcome, build_request, deliver, sign
from tests.stub_server import Reply, StubServer


def machine_and_action(
    url: str, *, secret: str | None = None, rules: tuple[WebhookHeaderRule, ...] = ()
) -> tuple[StateMachine, Action]:
    action = Action(name="notify", webhook=url, next_states=NoNext())
    machine = StateMachine(name="m", states=(action,), webhooks=rules, signing_secret=secret)
    return machine, action


def test_request_body_and_protocol_headers(stub: StubServer) -> None:
    machine, action = machine_and_action(stub.url("/hook/<label>"))
    request = build_request(machine, action, "a b", {"x": [1]}, token="42", timestamp=1700000000)
    with requests.Session() as session:
        result = deliver(session, request, timeout=2)
    assert result.outcome is Outcome.DELIVERED
    [received] = stub.received()
    assert (received.method, received.path) == ("POST", "/hook/a%20b")
    assert received.json() == {"label": "a b", "metadata": {"x": [1]}}
    assert received.headers["Content-Type"] == "application/json"
    assert received.headers["X-Idempotency-Token"] == "42"
    assert "webhook-signature" not in received.headers
    assert received.headers["User-Agent"].startswith("routemaster/")


def test_header_rules_apply_by_regex_and_cannot_override_the_token() -> None:
    rules = (
        WebhookHeaderRule(match=r"hooks\.example\.com", headers=(("Authorization", "one"),)),
        WebhookHeaderRule(match=r"/notify$", headers=(("Authorization", "two"), ("X-A", "a"))),
        WebhookHeaderRule(match=r"other\.com", headers=(("X-Never", "n"),)),
        WebhookHeaderRule(match=".", headers=(("X-Idempotency-Token", "forged"),)),
    )
    machine, action = machine_and_action("https://hooks.example.com/notify", rules=rules)
    request = build_request(machine, action, "l", {}, token="7", timestamp=0)
    assert request.headers["Authorization"] == "two"  # the later matching rule wins
    assert request.headers["X-A"] == "a"
    assert "X-Never" not in request.headers
    assert request.headers["X-Idempotency-Token"] == "7"


def expected_signature(key: bytes, message_id: str, timestamp: str, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def test_signed_request_verifies_like_standard_webhooks(stub: StubServer) -> None:
    machine, action = machine_and_action(stub.url("/hook"), secret="s3cret")
    request = build_request(machine, action, "l", {"a": 1}, token="99", timestamp=1700000123)
    with requests.Session() as session:
        deliver(session, request, timeout=2)
    [received] = stub.received()
    headers = received.headers
    assert headers["webhook-id"] == "99"
    assert headers["webhook-timestamp"] == "1700000123"
    assert headers["webhook-signature"] == expected_signature(
        b"s3cret", "99", "1700000123", received.body
    )


def test_whsec_secrets_are_base64_keys() -> None:
    key = b"\x01\x02binary-key"
    secret = "whsec_" + base64.b64encode(key).decode()
    assert sign(secret, "1", 5, b"{}") == expected_signature(key, "1", "5", b"{}")


def test_signature_changes_with_the_body() -> None:
    assert sign("k", "1", 5, b'{"a":1}') != sign("k", "1", 5, b'{"a":2}')


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        (Reply(204, b""), Outcome.DELIVERED),
        (Reply(410), Outcome.GONE),
        (Reply(500), Outcome.FAILED),
        (Reply(404), Outcome.FAILED),
        (Reply(302), Outcome.FAILED),  # redirects are not followed
        (Reply(200, delay=1.0), Outcome.FAILED),
    ],
)
def test_outcome_by_status(stub: StubServer, reply: Reply, outcome: Outcome) -> None:
    stub.script("/hook", reply)
    machine, action = machine_and_action(stub.url("/hook"))
    request = build_request(machine, action, "l", {}, token="1", timestamp=0)
    with requests.Session() as session:
        result = deliver(session, request, timeout=0.3)
    assert result.outcome is outcome
    if outcome is not Outcome.DELIVERED:
        assert result.error is not None
        assert stub.url("/hook") in result.error


def test_body_is_compact_json() -> None:
    machine, action = machine_and_action("http://h/")
    request = build_request(machine, action, "l", {"k": "v"}, token="1", timestamp=0)
    assert json.loads(request.body) == {"label": "l", "metadata": {"k": "v"}}
