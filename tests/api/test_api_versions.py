"""``GET /state-machines/{sm}/versions``, and the version on history entries and changes."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.config import describe_machine
from routemaster.db.history import stamp_versions
from routemaster.db.versions import digest_of, record_version
from routemaster.service import create_label
from routemaster.service.configuration import record_configuration


def test_each_distinct_definition_is_one_version(app: App, client: FlaskClient) -> None:
    assert client.get("/state-machines/user/versions").json == {"versions": [], "next": None}
    assert record_configuration(app).versions == {"user": 1, "empty": 1}
    assert record_configuration(app).versions == {
        "user": 1,
        "empty": 1,
    }  # the same digest: no new one
    machine = app.config.get_machine("user")
    changed = dataclasses.replace(machine, states=machine.states[:1])
    with app.db.begin() as conn:
        assert record_version(conn, "user", describe_machine(changed)) == 2
    body = client.get("/state-machines/user/versions").json
    assert body is not None
    assert [v["version"] for v in body["versions"]] == [1, 2]
    first = body["versions"][0]
    assert first["definition"] == describe_machine(machine)
    assert first["digest"] == digest_of(describe_machine(machine))
    assert body["next"] is None


def test_versions_are_paged(app: App, client: FlaskClient) -> None:
    machine = app.config.get_machine("user")
    with app.db.begin() as conn:
        for count in range(1, 4):
            shorter = dataclasses.replace(machine, states=machine.states[:count])
            record_version(conn, "user", describe_machine(shorter))
    page = client.get("/state-machines/user/versions?limit=2").json
    assert page is not None
    assert [v["version"] for v in page["versions"]] == [1, 2]
    assert page["next"] == "/state-machines/user/versions?limit=2&after=2"
    rest = client.get(page["next"]).json
    assert rest is not None
    assert ([v["version"] for v in rest["versions"]], rest["next"]) == ([3], None)


def test_bad_paging_and_unknown_machines_are_client_errors(client: FlaskClient) -> None:
    assert client.get("/state-machines/user/versions?limit=0").status_code == 400
    assert client.get("/state-machines/user/versions?after=x").status_code == 400
    assert client.get("/state-machines/user/versions?colour=red").status_code == 400
    assert client.get("/state-machines/nope/versions").status_code == 404


def test_history_entries_carry_the_version_they_were_made_under(
    app: App, client: FlaskClient, database_url: str
) -> None:
    versions = record_configuration(app).versions
    engine = sa.create_engine(database_url)
    stamp_versions(engine, versions)
    stamped = dataclasses.replace(app, db=engine)
    try:
        create_label(stamped, app.config.get_machine("user"), "alice", {})
    finally:
        engine.dispose()
    client.post("/state-machines/user/labels/bob", json={"metadata": {}})  # an unstamped process
    alice = client.get("/state-machines/user/labels/alice/history").json
    bob = client.get("/state-machines/user/labels/bob/history").json
    assert alice is not None and bob is not None
    assert [entry["version"] for entry in alice["history"]] == [1]
    assert [entry["version"] for entry in bob["history"]] == [None]
