"""``GET /metrics``: requests by endpoint template, transitions, and the label gauges."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from routemaster.app import App, Clock, Settings, utc_now
from routemaster.config.model import Config
from routemaster.db.plumbing.database import distributed
from routemaster.metrics import Metrics, outcome
from routemaster.metrics.label_gauges import SNAPSHOT_FILE, LabelGauges
from routemaster.web import create_app
from tests.api.conftest import config
from tests.api.openapi_check import CheckedClient

__all__ = ["config"]  # the API tests' configuration, a fixture

LABELS = "/state-machines/user/labels"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: FlaskClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def metered_app(config: Config, db: sa.Engine, clock: Clock = utc_now) -> App:
    """An App whose ``/metrics`` counts what its loggers are told, its gauges read afresh at
    every scrape."""
    metrics = Metrics()
    return App(
        config=config,
        db=db,
        settings=Settings(label_gauges_interval=0),
        metrics=metrics,
        loggers=(metrics.observer(),),
        clock=clock,
    )


@pytest.fixture
def metered(db_engine: sa.Engine, config: Config) -> flask.Flask:
    flask_app = create_app(metered_app(config, db_engine))
    flask_app.test_client_class = CheckedClient
    return flask_app


@pytest.fixture
def client(metered: flask.Flask) -> FlaskClient:
    return metered.test_client()


def test_requests_are_counted_by_endpoint_template_never_by_label(client: FlaskClient) -> None:
    for name in ("a", "b%2Fc", "secret-customer-42"):
        assert client.post(f"{LABELS}/{name}", json={"metadata": {}}).status_code == 201
        assert client.get(f"{LABELS}/{name}").status_code == 200
    assert client.get(f"{LABELS}/nobody").status_code == 404
    assert client.get("/nowhere").status_code == 404
    samples = scrape(client)
    label = "/state-machines/{sm}/labels/{label}"
    requests = "routemaster_http_requests_total"
    assert value(samples, requests, method="POST", endpoint=label, status="201") == 3
    assert value(samples, requests, method="GET", endpoint=label, status="200") == 3
    assert value(samples, requests, method="GET", endpoint=label, status="404") == 1
    assert value(samples, requests, method="GET", endpoint="unmatched", status="404") == 1
    histogram = "routemaster_http_request_duration_seconds_count"
    assert value(samples, histogram, method="GET", endpoint=label, status="200") == 3
    text = client.get("/metrics").get_data(as_text=True)
    assert "secret-customer-42" not in text
    assert "b%2Fc" not in text


def test_label_reads_are_counted_by_where_they_ran(
    client: FlaskClient, db_engine: sa.Engine
) -> None:
    """On one server through DATABASE_URL; on Citus on the node holding the label (the Citus
    pass checks that one: tests/console/test_label_reads_citus.py)."""
    client.post(f"{LABELS}/a", json={"metadata": {}})
    for _ in range(2):
        assert client.get(f"{LABELS}/a").status_code == 200
    assert client.get(f"{LABELS}/nobody").status_code == 404
    reads = "routemaster_label_reads_total"
    route = "node" if distributed(db_engine) else "database"
    assert value(scrape(client), reads, route=route) == 3


def test_transitions_are_counted_by_machine_and_states(client: FlaskClient) -> None:
    client.post(f"{LABELS}/a", json={"metadata": {}})
    client.post(f"{LABELS}/b", json={"metadata": {}})
    client.patch(f"{LABELS}/a", json={"metadata": {"ready": True, "route": "fast"}})
    client.patch(f"{LABELS}/b", json={"metadata": {"ready": True}})
    client.delete(f"{LABELS}/b")
    samples = scrape(client)
    transitions = "routemaster_transitions_total"
    assert value(samples, transitions, state_machine="user", from_state="start", to_state="done")
    assert (
        value(samples, transitions, state_machine="user", from_state="start", to_state="review")
        == 1
    )
    assert value(samples, transitions, state_machine="user", from_state="review", to_state="") == 1


def _set(db_engine: sa.Engine, sql: str) -> None:
    with db_engine.begin() as conn:
        conn.execute(sa.text(sql))


def test_label_gauges_count_every_state_due_and_errored(
    client: FlaskClient, db_engine: sa.Engine
) -> None:
    for name in ("a", "b", "c"):
        client.post(f"{LABELS}/{name}", json={"metadata": {}})
    _set(  # a move, as routemaster writes one: the row and a history entry
        db_engine,
        "WITH moved AS (UPDATE labels SET state = 'notify', errored = true WHERE name = 'a'"
        " RETURNING shard_key, state_machine, name)"
        " INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created)"
        " SELECT shard_key, state_machine, name, 'start', 'notify', now() FROM moved",
    )
    _set(db_engine, "UPDATE labels SET due_at = now() - interval '1 minute' WHERE name = 'b'")
    samples = scrape(client)
    assert value(samples, "routemaster_labels", state_machine="user", state="start") == 2
    assert value(samples, "routemaster_labels", state_machine="user", state="notify") == 1
    assert ("routemaster_labels", frozenset({("state_machine", "empty"), ("state", "only")})) in (
        samples
    ), "configured states with no labels are reported as 0"
    assert value(samples, "routemaster_labels_errored", state_machine="user", state="notify") == 1
    assert value(samples, "routemaster_labels_due", state_machine="user", state="start") == 1


class Statements:
    """Counts the SQL statements an engine runs."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        self._engine = engine

    def __enter__(self) -> Statements:
        sa.event.listen(self._engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(self._engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1


@pytest.fixture
def clock() -> Iterator[list[float]]:
    yield [1000.0]


def test_gauges_are_counted_at_most_once_per_interval_across_processes(
    db_engine: sa.Engine, config: Config, tmp_path: Any, clock: list[float]
) -> None:
    """Two collectors sharing a directory stand for two gunicorn workers."""
    workers = [
        LabelGauges(db_engine, config, interval=5, directory=str(tmp_path), clock=lambda: clock[0])
        for _ in range(2)
    ]
    _set(
        db_engine,
        "WITH entry AS (INSERT INTO history (shard_key, state_machine, label, old_state,"
        " new_state, created) VALUES (routemaster_shard_key('x'), 'user', 'x', NULL, 'start',"
        " now()) RETURNING id)"
        " INSERT INTO labels (state_machine, name, state, state_entered_at, "
        "entry_id, name_key, shard_key) SELECT 'user', 'x', 'start', now(), entry.id,"
        " routemaster_label_key('x'), routemaster_shard_key('x') FROM entry",
    )
    with Statements(db_engine) as statements:
        first = workers[0].counts()
        assert first is not None
        counted = statements.count
        assert counted > 0
        _set(db_engine, "DELETE FROM labels; DELETE FROM history")
        for worker in workers * 3:
            again = worker.counts()
            assert again is not None
            assert again.labels == {("user", "start"): 1}  # within the interval: the snapshot
        assert statements.count == counted + 1  # only the DELETE above
        clock[0] += 5
        fresh = workers[1].counts()
        assert fresh is not None
        assert fresh.labels == {}


def _by_version(
    db_engine: sa.Engine,
    config: Config,
    clock: list[float],
    in_force: dict[str, int],
    directory: str | None = None,
) -> dict[tuple[str, str], float]:
    """``routemaster_labels_by_version`` as collected, the machine ``user`` continuing."""
    machines = tuple(
        dataclasses.replace(machine, upgrade_strategy="continue")
        if machine.name == "user"
        else machine
        for machine in config.state_machines
    )
    continuing = dataclasses.replace(config, state_machines=machines)
    gauges = LabelGauges(
        db_engine,
        continuing,
        interval=5,
        in_force=in_force,
        directory=directory,
        clock=lambda: clock[0],
    )
    [family] = [f for f in gauges.collect() if f.name == "routemaster_labels_by_version"]
    return {
        (sample.labels["state_machine"], sample.labels["version"]): sample.value
        for sample in family.samples
    }


def _labels_on_versions(db_engine: sa.Engine, versions: dict[str, str]) -> None:
    """Labels of ``user`` in ``start``, each on its version (``NULL``: keeping none)."""
    for name, version in versions.items():
        _set(
            db_engine,
            "WITH entry AS (INSERT INTO history (shard_key, state_machine, label, old_state,"
            f" new_state, created) VALUES (routemaster_shard_key('{name}'), 'user', '{name}',"
            " NULL, 'start', now()) RETURNING id)"
            " INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id,"
            f" name_key, shard_key, version) SELECT 'user', '{name}', 'start', now(), entry.id,"
            f" routemaster_label_key('{name}'), routemaster_shard_key('{name}'), {version}"
            " FROM entry",
        )


def test_labels_by_version_read_off_the_version_in_force(
    db_engine: sa.Engine, config: Config, clock: list[float]
) -> None:
    """A continue machine's labels per version they follow: those on the version in force
    (and those that keep none, which follow it) are the machine's labels less the others."""
    _labels_on_versions(db_engine, {"a": "1", "b": "2", "c": "2", "d": "NULL"})
    assert _by_version(db_engine, config, clock, {"user": 2}) == {
        ("user", "1"): 1,
        ("user", "2"): 3,
    }


def test_labels_by_version_shown_alike_from_the_shared_snapshot(
    db_engine: sa.Engine, config: Config, clock: list[float], tmp_path: Any
) -> None:
    """A worker that shows another's snapshot (multiprocess mode) shows the same series."""
    _labels_on_versions(db_engine, {"a": "1", "b": "2", "c": "NULL"})
    counted = _by_version(db_engine, config, clock, {"user": 2}, str(tmp_path))
    _set(db_engine, "DELETE FROM labels; DELETE FROM history")
    shown = _by_version(db_engine, config, clock, {"user": 2}, str(tmp_path))
    assert counted == shown == {("user", "1"): 1, ("user", "2"): 2}


def test_a_snapshot_written_before_labels_beside_the_version_in_force_is_counted_again(
    db_engine: sa.Engine, config: Config, clock: list[float], tmp_path: Any
) -> None:
    """A snapshot file of an older release (its labels per version already figured) is not
    shown: the labels are counted again."""
    _labels_on_versions(db_engine, {"a": "1", "b": "2"})
    (tmp_path / SNAPSHOT_FILE).write_text(
        json.dumps(
            {
                "taken": clock[0],
                "labels": [["user", "start", 9]],
                "due": [],
                "errored": [],
                "versions": [["user", "1", 9]],
            }
        )
    )
    shown = _by_version(db_engine, config, clock, {"user": 2}, str(tmp_path))
    assert shown == {("user", "1"): 1, ("user", "2"): 1}


def test_labels_by_version_leaves_out_versions_with_no_label(
    db_engine: sa.Engine, config: Config, clock: list[float]
) -> None:
    """Every label on an older version: the version in force has no series."""
    _labels_on_versions(db_engine, {"a": "1", "b": "3"})
    assert _by_version(db_engine, config, clock, {"user": 4}) == {
        ("user", "1"): 1,
        ("user", "3"): 1,
    }


def test_labels_by_version_with_no_version_in_force_shows_only_kept_versions(
    db_engine: sa.Engine, config: Config, clock: list[float]
) -> None:
    """No version recorded: the labels that keep one are shown by theirs, the others (which
    follow no known version) are left out."""
    _labels_on_versions(db_engine, {"a": "1", "b": "2", "c": "NULL"})
    assert _by_version(db_engine, config, clock, {}) == {("user", "1"): 1, ("user", "2"): 1}


def test_outcomes_of_outbound_calls() -> None:
    assert [outcome(s) for s in (200, 204, 410, 500, 404, None)] == [
        "success",
        "success",
        "gone",
        "failure",
        "failure",
        "error",
    ]
