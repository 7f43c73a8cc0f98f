"""The console's pages as HTML (without JavaScript), its buttons, and its sign-in hook."""

from __future__ import annotations

import re
from html import unescape

import flask
import pytest
from flask.testing import FlaskClient

from routemaster.console.access import CSRF_COOKIE, TOKEN_CHECK_KEY, TOKEN_COOKIE

LABELS = "/state-machines/user/labels"


def _page(client: FlaskClient, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.data[:300]
    assert response.mimetype == "text/html"
    return response.get_data(as_text=True)


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match[1]


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_the_change_streams_refuse_as_pages_as_documented(client: FlaskClient) -> None:
    """The checked client holds each answer to the document: HTML, as every console error."""
    assert "nope" in _page(client, "/console/machines/nope/changes", 404)
    assert "position" in _page(client, "/console/changes?after=yesterday", 400)
    assert "position" in _page(client, "/console/machines/user/changes?after=1", 400)


def test_error_pages_have_the_navigation_of_every_page(client: FlaskClient) -> None:
    """A missing machine or bulk job: the same links as the front page."""
    front = _page(client, "/console/", 200)
    assert "Subscriptions" in front
    for address in ("/console/bulk/12345", "/console/machines/nope"):
        assert "Subscriptions" in _page(client, address, 404), address


def test_front_page_lists_each_machine_with_counts_per_state(client: FlaskClient) -> None:
    for name in ("a", "b"):
        client.post(f"{LABELS}/{name}", json={"metadata": {}})
    client.patch(f"{LABELS}/b", json={"metadata": {"ready": True}})
    html = _page(client, "/console/")
    assert 'href="/console/machines/user"' in html and 'href="/console/machines/empty"' in html
    assert re.search(r'data-machine="user" data-state="start">1<', html)
    assert re.search(r'data-machine="user" data-state="review">1<', html)
    assert re.search(r'data-machine="empty" data-state="only">0<', html)
    assert 'data-changes="/console/changes"' in html and "data-seen=" in html


def test_machine_page_draws_the_graph_with_counts_and_recent_changes(client: FlaskClient) -> None:
    client.post(f"{LABELS}/ann", json={"metadata": {}})
    html = _page(client, "/console/machines/user")
    svg = html[html.index("<svg") : html.index("</svg>")]
    for state in ("start", "review", "notify", "done"):
        assert f">{state}</text>" in svg
    assert (
        svg.count('class="edge"') == 4
    )  # start->review, start->done, review->notify, notify->done
    assert "= fast" in svg and "otherwise" in svg  # the context edge's value and default
    assert "on metadata.ready" in svg and "on entry" in svg and "webhook" in svg
    assert re.search(r'data-state="start">1</tspan>', svg)
    assert "ann" in _text(html[html.index('id="changes"') :])
    assert 'data-changes="/console/machines/user/changes"' in html
    assert _page(client, "/console/machines/nope", 404)


def test_labels_are_searched_by_name_prefix_and_state(client: FlaskClient) -> None:
    for name in ("apple", "apricot", "banana"):
        client.post(f"{LABELS}/{name}", json={"metadata": {}})
    client.patch(f"{LABELS}/apricot", json={"metadata": {"ready": True}})
    found = _text(_page(client, "/console/machines/user/labels?prefix=ap"))
    assert "apple" in found and "apricot" in found and "banana" not in found
    in_review = _text(_page(client, "/console/machines/user/labels?prefix=ap&state=review"))
    assert "apricot" in in_review and "apple" not in in_review


def test_label_page_shows_metadata_history_and_why_it_waits(client: FlaskClient) -> None:
    client.post(f"{LABELS}/a%2Fb", json={"metadata": {"route": "<slow>"}})
    client.patch(f"{LABELS}/a%2Fb", json={"metadata": {"ready": True}})
    html = _page(client, "/console/machines/user/labels/a%2Fb")
    text = _text(html)
    assert "&lt;slow&gt;" in html and "<slow>" not in html  # escaped, never markup
    assert "review" in text and "start" in text  # state and history
    assert "metadata.approved = true" in text and "does not hold" in text
    assert 'data-label="a/b"' in html
    assert _page(client, "/console/machines/user/labels/nobody", 404)


def test_a_label_in_an_end_state_is_shown_as_finished(client: FlaskClient) -> None:
    client.post(f"{LABELS}/fin", json={"metadata": {"route": "fast"}})
    client.patch(f"{LABELS}/fin", json={"metadata": {"ready": True}})  # start -> done
    text = _text(_page(client, "/console/machines/user/labels/fin"))
    assert "An end state: the label has finished here and stays" in text
    assert "Next check: none: an end state, nothing moves the label on" in text
    assert "until the metadata changes" not in text
    # a gate that waits for its metadata still says so
    client.post(f"{LABELS}/waits", json={"metadata": {}})
    waiting = _text(_page(client, "/console/machines/user/labels/waits"))
    assert "none: it cannot hold until the metadata changes" in waiting


def test_operator_buttons_need_the_pages_csrf_token(client: FlaskClient) -> None:
    client.post(f"{LABELS}/ann", json={"metadata": {}})
    html = _page(client, "/console/machines/user/labels/ann")
    assert client.get_cookie(CSRF_COOKIE, path="/console/") is not None
    forged = client.post("/console/machines/user/labels/ann/pause", data={"csrf": "guess"})
    assert forged.status_code == 403
    assert client.get(f"{LABELS}/ann").get_json()["paused"] is False

    paused = client.post(
        "/console/machines/user/labels/ann/pause", data={"csrf": _csrf(html), "reason": "audit"}
    )
    assert paused.status_code == 303
    assert "notice=" in paused.headers["Location"]
    assert client.get(f"{LABELS}/ann").get_json()["paused"] is True
    history = client.get(f"{LABELS}/ann/history").get_json()["history"]
    assert (history[-1]["forced"], history[-1]["reason"]) == (True, "audit")

    other_site = client.post(
        "/console/machines/user/labels/ann/resume",
        data={"csrf": _csrf(html)},
        headers={"Origin": "https://elsewhere.example"},
    )
    assert other_site.status_code == 403


def test_a_forced_move_from_the_console_is_recorded(client: FlaskClient) -> None:
    client.post(f"{LABELS}/ann", json={"metadata": {}})
    token = _csrf(_page(client, "/console/machines/user/labels/ann"))
    moved = client.post(
        "/console/machines/user/labels/ann/move",
        data={"csrf": token, "state": "done", "reason": "ticket 7"},
    )
    assert moved.status_code == 303
    assert client.get(f"{LABELS}/ann").get_json()["state"] == "done"
    refused = client.post(
        "/console/machines/user/labels/ann/retry", data={"csrf": token}, follow_redirects=True
    )
    assert "not errored" in _text(refused.get_data(as_text=True))


def test_without_authentication_the_login_page_says_so(client: FlaskClient) -> None:
    assert "Authentication is off" in _text(_page(client, "/console/login"))


@pytest.fixture
def tokens(flask_app: flask.Flask) -> dict[str, frozenset[str]]:
    """Tokens on: the console's token check, as authentication plugs into it."""
    known = {
        "reader-secret": frozenset({"read"}),
        "operator-secret": frozenset({"read", "operate"}),
        "writer-secret": frozenset({"write"}),
    }
    flask_app.extensions[TOKEN_CHECK_KEY] = known.get
    return known


def _sign_in(client: FlaskClient, secret: str) -> int:
    token = _csrf(_page(client, "/console/login"))
    response = client.post("/console/login", data={"csrf": token, "token": secret})
    return response.status_code


def test_with_tokens_the_console_asks_to_sign_in(
    client: FlaskClient, tokens: dict[str, frozenset[str]]
) -> None:
    response = client.get("/console/machines/user")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/console/login")
    assert _sign_in(client, "wrong") == 401
    assert _sign_in(client, "writer-secret") == 401  # may not read
    assert _sign_in(client, "reader-secret") == 303
    cookie = client.get_cookie(TOKEN_COOKIE, path="/console/")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Strict"
    assert _page(client, "/console/machines/user")


def test_with_tokens_the_consoles_own_stream_needs_the_sign_in(
    client: FlaskClient, tokens: dict[str, frozenset[str]]
) -> None:
    """EventSource cannot send a bearer header: the console's pages follow a cookie stream."""
    refused = client.get("/console/changes")
    assert refused.status_code == 302 and "/console/login" in refused.headers["Location"]
    _sign_in(client, "reader-secret")
    stream = client.head("/console/machines/user/changes")
    assert stream.status_code == 200
    assert stream.mimetype == "text/event-stream"


def test_a_reading_token_sees_no_operator_buttons_and_cannot_operate(
    client: FlaskClient, tokens: dict[str, frozenset[str]]
) -> None:
    client.post(f"{LABELS}/ann", json={"metadata": {}})
    _sign_in(client, "reader-secret")
    html = _page(client, "/console/machines/user/labels/ann")
    assert "/ann/pause" not in html and "Move to" not in html
    token = _csrf(html)  # the sign-out form still carries one
    refused = client.post("/console/machines/user/labels/ann/pause", data={"csrf": token})
    assert refused.status_code == 403
    assert client.get(f"{LABELS}/ann").get_json()["paused"] is False


def test_an_operating_token_gets_the_buttons_and_signing_out_ends_it(
    client: FlaskClient, tokens: dict[str, frozenset[str]]
) -> None:
    client.post(f"{LABELS}/ann", json={"metadata": {}})
    _sign_in(client, "operator-secret")
    html = _page(client, "/console/machines/user/labels/ann")
    assert "/ann/pause" in html
    client.post("/console/logout", data={"csrf": _csrf(html)})
    assert client.get("/console/").status_code == 302
    tokens.pop("operator-secret")  # revoked: a kept cookie stops working at once
    _sign_in(client, "reader-secret")
    client.set_cookie(TOKEN_COOKIE, "operator-secret", path="/console/")
    assert client.get("/console/").status_code == 302
