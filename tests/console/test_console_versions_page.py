"""The console's versions page: every version of a machine, and what changed between two."""

from __future__ import annotations

import re
from html import unescape

from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.config import describe_machine
from routemaster.db.versions import record_version


def _text(client: FlaskClient, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.text
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.text)).split())


def test_versions_and_the_difference_of_two(app: App, client: FlaskClient) -> None:
    assert "No version recorded yet" in _text(client, "/console/machines/user/versions")
    machine = app.config.get_machine("user")
    first = describe_machine(machine)
    second = describe_machine(machine)
    second["states"] = [dict(state) for state in first["states"]]
    second["states"][2]["webhook"] = "http://127.0.0.1:9/hooks/v2/<label>"
    second["states"].append(
        {
            "name": "archive",
            "kind": "gate",
            "exit_condition": "false",
            "triggers": [],
            "webhook": None,
            "next": {"type": "none"},
            "end": True,
        }
    )
    with app.db.begin() as conn:
        record_version(conn, "user", first)
        record_version(conn, "user", second)
    listing = _text(client, "/console/machines/user/versions")
    assert "Versions version first applied digest states 2" in listing
    diff = _text(client, "/console/machines/user/versions?from=1&to=2")
    assert "From version 1 to version 2" in diff
    assert "notify changed webhook" in diff
    assert "archive added" in diff
    same = _text(client, "/console/machines/user/versions?from=2&to=2")
    assert "The two versions are the same." in same
    _text(client, "/console/machines/user/versions?from=1&to=9", 404)
    _text(client, "/console/machines/user/versions?from=x&to=2", 400)
    assert "Versions of this machine" in _text(client, "/console/machines/user")
