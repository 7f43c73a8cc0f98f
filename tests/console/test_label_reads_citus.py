"""On Citus, the console's receivers page lists the nodes a read of one label goes to.

Runs when ``ROUTEMASTER_TEST_CITUS_URL`` names a Citus coordinator; skipped otherwise.
"""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient
from prometheus_client import generate_latest

from routemaster.app import App
from routemaster.db.nodes import route_reads, route_writes
from routemaster.metrics import Metrics
from tests.citus_cluster import Cluster
from tests.console.test_console import LABELS, _page, _text

pytestmark = pytest.mark.citus


def test_each_node_holding_shards_is_listed_and_read_from(
    citus_cluster: Cluster, client: FlaskClient, app: App
) -> None:
    name = citus_cluster.names_on(citus_cluster.workers[0], "console", 1)[0]
    assert client.post(f"{LABELS}/{name}", json={"metadata": {}}).status_code == 201
    assert client.get(f"{LABELS}/{name}").status_code == 200  # read on its worker

    text = _text(_page(client, "/console/receivers")).partition("Label reads")[2]
    for worker in citus_cluster.workers:
        assert f"{worker.host}:{worker.port}" in text
    assert "sent here" in text and "unreachable" not in text


def test_reads_are_counted_by_where_they_ran(
    citus_cluster: Cluster, client: FlaskClient, app: App
) -> None:
    app.metrics = Metrics()
    name = citus_cluster.names_on(citus_cluster.workers[1], "counted", 1)[0]
    client.post(f"{LABELS}/{name}", json={"metadata": {}})
    for _ in range(3):
        assert client.get(f"{LABELS}/{name}").status_code == 200
    assert client.get(f"{LABELS}/{name}/history").status_code == 200

    exposed = generate_latest(app.metrics.registry()).decode()
    # three GETs, and the history's two reads (the label, to answer 404 for an unknown one)
    assert 'routemaster_label_reads_total{route="node"} 5.0' in exposed


def test_with_routing_off_the_page_says_so(
    citus_cluster: Cluster, client: FlaskClient, app: App
) -> None:
    route_reads(app.db, on=False)
    text = _text(_page(client, "/console/receivers")).partition("Label reads")[2]
    assert "routing to the nodes holding each label is off" in text


def test_the_page_says_where_writes_go(
    citus_cluster: Cluster, client: FlaskClient, app: App
) -> None:
    text = _text(_page(client, "/console/receivers")).partition("Label reads and writes")[2]
    assert "A write of one label" in text and "goes to the node holding its shard" in text
    route_writes(app.db, on=False)
    text = _text(_page(client, "/console/receivers")).partition("Label reads and writes")[2]
    assert "routing them to the nodes is off" in text and "A write of one label" not in text


def test_writes_are_counted_by_where_they_ran(
    citus_cluster: Cluster, client: FlaskClient, app: App
) -> None:
    app.metrics = Metrics()
    name = citus_cluster.names_on(citus_cluster.workers[0], "written", 1)[0]
    assert client.post(f"{LABELS}/{name}", json={"metadata": {}}).status_code == 201
    assert client.patch(f"{LABELS}/{name}", json={"metadata": {"n": 1}}).status_code == 200
    assert client.delete(f"{LABELS}/{name}").status_code == 204

    exposed = generate_latest(app.metrics.registry()).decode()
    assert 'routemaster_label_writes_total{route="node"} 3.0' in exposed
