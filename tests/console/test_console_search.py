"""The console's search box and bulk action: the same expressions, a count before running."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import parse_qs, urlsplit

from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.service.bulk import run_batch

LABELS = "/state-machines/user/labels"
PAGE = "/console/machines/user/labels"


def _html(client: FlaskClient, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.data[:300]
    return response.get_data(as_text=True)


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match
    return match[1]


def _labels_shown(html: str) -> list[str]:
    return re.findall(r'href="/console/machines/user/labels/([^"]+)"', html)


def _orders(client: FlaskClient) -> None:
    for index in range(6):
        client.post(f"{LABELS}/o{index}", json={"metadata": {"total": index * 50}})


def test_the_search_box_takes_the_same_expressions(client: FlaskClient) -> None:
    _orders(client)
    html = _html(client, PAGE + "?where=metadata.total+>+100")
    assert _labels_shown(html) == ["o3", "o4", "o5"]
    assert 'value="metadata.total &gt; 100"' in html


def test_a_bad_expression_shows_the_caret_message(client: FlaskClient) -> None:
    html = _html(client, PAGE + "?where=metadata.total+%3D%3D+1", 400)
    assert "Unknown operator == (did you mean =?)" in unescape(html)
    assert "~~" in html


def test_a_bulk_action_shows_its_count_before_it_runs(client: FlaskClient, app: App) -> None:
    _orders(client)
    page = _html(client, PAGE + "?where=metadata.total+>%3D+100")
    form = {
        "csrf": _csrf(page),
        "where": "metadata.total >= 100",
        "state": "",
        "prefix": "",
        "command": "pause",
        "to": "",
        "reason": "hold big orders",
    }
    assert client.post("/console/machines/user/bulk", data={**form, "csrf": "x"}).status_code == 403
    confirm = client.post("/console/machines/user/bulk", data=form)
    assert confirm.status_code == 200
    html = confirm.get_data(as_text=True)
    assert '<strong id="bulk-count">4</strong>' in html
    assert 'name="expect" value="4"' in html
    assert all(not client.get(f"{LABELS}/o{i}").get_json()["paused"] for i in range(6))
    ran = client.post("/console/machines/user/bulk", data={**form, "expect": "4"})
    assert ran.status_code == 303
    progress_url = ran.headers["Location"]
    assert re.fullmatch(r"/console/bulk/\d+", progress_url)
    while run_batch(app, limit=100):
        pass
    progress = _html(client, progress_url)
    assert '<td id="bulk-done">4</td>' in progress and "finished" in progress
    assert [client.get(f"{LABELS}/o{i}").get_json()["paused"] for i in range(6)] == [
        False,
        False,
        True,
        True,
        True,
        True,
    ]


def test_a_count_that_changed_runs_nothing(client: FlaskClient) -> None:
    _orders(client)
    page = _html(client, PAGE + "?state=start")
    form = {"csrf": _csrf(page), "state": "start", "command": "pause", "reason": "x", "expect": "2"}
    ran = client.post("/console/machines/user/bulk", data=form)
    assert ran.status_code == 303
    problem = parse_qs(urlsplit(ran.headers["Location"]).query)["problem"][0]
    assert problem == "6 labels match now, not 2: nothing was done."
    assert "6 labels match now, not 2" in _html(client, ran.headers["Location"])


def test_a_bulk_pause_from_the_console_can_end_by_itself(client: FlaskClient, app: App) -> None:
    _orders(client)
    page = _html(client, PAGE + "?prefix=o1")
    assert 'name="until"' in page
    form = {
        "csrf": _csrf(page),
        "prefix": "o1",
        "command": "pause",
        "until": "2099-01-01T09:00:00+00:00",
        "reason": "hold",
    }
    confirm = client.post("/console/machines/user/bulk", data=form).get_data(as_text=True)
    assert "until 2099-01-01T09:00:00+00:00" in confirm
    assert 'name="until" value="2099-01-01T09:00:00+00:00"' in confirm
    ran = client.post("/console/machines/user/bulk", data={**form, "expect": "1"})
    while run_batch(app, limit=100):
        pass
    progress = _html(client, ran.headers["Location"])
    assert "<td>2099-01-01T09:00:00+00:00</td>" in progress
    explained = client.get(f"{LABELS}/o1/explain").get_json()
    assert explained["paused_until"] == "2099-01-01T09:00:00+00:00"
