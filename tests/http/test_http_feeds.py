import pytest
import requests

from routemaster.config.model import Feed, StateMachine, WebhookHeaderRule
from routemaster.exit_conditions.context import FeedUnavailable
from routemaster.http.feeds import fetch_feed
from tests.stub_server import Reply, StubServer


def machine_with_feed(stub: StubServer, **extra: object) -> StateMachine:
    return StateMachine(
        name="m/1",
        states=(),
        feeds=(Feed("jacquard", stub.url("/feeds/<state_machine>/<label>")),),
        **extra,  # type: ignore[arg-type]
    )


def test_fetches_json_for_the_label(stub: StubServer) -> None:
    stub.reply_json("/feeds/m%2F1/a%2Fb", {"variant": "b"})
    with requests.Session() as session:
        value = fetch_feed(session, machine_with_feed(stub), "jacquard", "a/b", timeout=2)
    assert value == {"variant": "b"}
    [request] = stub.received()
    assert request.method == "GET"


def test_sends_headers_of_matching_rules_only(stub: StubServer) -> None:
    machine = machine_with_feed(
        stub,
        webhooks=(
            WebhookHeaderRule(match=r"127\.0\.0\.1", headers=(("Authorization", "Bearer t"),)),
            WebhookHeaderRule(match=r"example\.com", headers=(("X-Other", "no"),)),
        ),
    )
    with requests.Session() as session:
        fetch_feed(session, machine, "jacquard", "x", timeout=2)
    [request] = stub.received()
    assert request.headers["Authorization"] == "Bearer t"
    assert "X-Other" not in request.headers


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(status=503), "returned status 503"),
        (Reply(status=404), "returned status 404"),
        (Reply(status=200, body=b"<html>"), "not valid JSON"),
        (Reply(status=200, delay=1.0), "timed out"),
    ],
)
def test_any_failure_is_feed_unavailable_with_url_and_status(
    stub: StubServer, reply: Reply, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    stub.script("/feeds/m%2F1/x", reply)
    with requests.Session() as session, pytest.raises(FeedUnavailable) as raised:
        fetch_feed(session, machine_with_feed(stub), "jacquard", "x", timeout=0.3)
    assert raised.value.feed == "jacquard"
    assert stub.url("/feeds/m%2F1/x") in raised.value.reason
    assert expected in raised.value.reason
    assert stub.url("/feeds/m%2F1/x") in caplog.text


def test_unreachable_server_is_feed_unavailable() -> None:
    machine = StateMachine(name="m", states=(), feeds=(Feed("f", "http://127.0.0.1:9/<label>"),))
    with requests.Session() as session, pytest.raises(FeedUnavailable, match="ConnectionError"):
        fetch_feed(session, machine, "f", "x", timeout=1)
