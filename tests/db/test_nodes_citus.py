"""On Citus, a read of one label goes to the node holding its shard, and follows the shard.

The coordinator then spends nothing on it (SPEC G1). A shard moved since the
placement was read is still read correctly (the old node asks the new one),
and once the placement is read again the reads go to the new node.

Runs when ``ROUTEMASTER_TEST_CITUS_URL`` names a Citus coordinator; skipped otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from routemaster.db import nodes as routing
from routemaster.db.keys import shard_key
from routemaster.db.nodes import dispose_nodes, near, nodes_of, route_reads
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import fetch_value
from tests.citus_cluster import Cluster, refused_connection

pytestmark = pytest.mark.citus

_INSERT = sa.text(
    "INSERT INTO labels (state_machine, name, name_key, shard_key, state, metadata,"
    " state_entered_at, entry_id) VALUES ('m', :name, CAST(:name AS bytea), :key, 's',"
    " CAST(:metadata AS jsonb), now(), 1)"
)
_READ = "SELECT metadata ->> 'n' FROM labels WHERE shard_key = %(key)s AND name = %(name)s"
_WHERE_AM_I = "SELECT inet_server_port()"
_SHARD_OF_KEY = sa.text("SELECT get_shard_id_for_distribution_column('labels', :key)")
_MOVE = sa.text(
    "SELECT citus_move_shard_placement(:shard, '127.0.0.1', :source, '127.0.0.1', :target,"
    " shard_transfer_mode => 'block_writes')"
)


@pytest.fixture
def engine(citus_cluster: Cluster) -> Iterator[sa.Engine]:
    """The service's engine on the coordinator, with the node pools it opens disposed after."""
    made = create_engine(citus_cluster.url)
    yield made
    dispose_nodes(made)
    made.dispose()


def _label(engine: sa.Engine, name: str, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(_INSERT, {"name": name, "key": shard_key(name), "metadata": f'{{"n": {n}}}'})


def _read(engine: sa.Engine, name: str) -> tuple[int, str]:
    """The port of the server that answered, and the label's ``n``."""
    with near(engine, name) as conn:
        port = fetch_value(conn, _WHERE_AM_I)
    with near(engine, name) as conn:
        value = fetch_value(conn, _READ, {"key": shard_key(name), "name": name})
    return port, value


def test_a_label_is_read_on_the_worker_holding_it(
    citus_cluster: Cluster, engine: sa.Engine
) -> None:
    names = {node: citus_cluster.names_on(node, "near", 3) for node in citus_cluster.workers}
    for n, name in enumerate(name for group in names.values() for name in group):
        _label(engine, name, n)

    for node, group in names.items():
        for name in group:
            port, _ = _read(engine, name)
            assert port == node.port

    found = nodes_of(engine)
    assert found is not None and found.routed >= 12 and found.fell_back == 0


def test_reads_stay_on_the_coordinator_when_routing_is_off(
    citus_cluster: Cluster, engine: sa.Engine
) -> None:
    route_reads(engine, on=False)
    name = citus_cluster.names_on(citus_cluster.workers[0], "off", 1)[0]
    _label(engine, name, 7)

    assert _read(engine, name) == (citus_cluster.coordinator.port, "7")
    assert nodes_of(engine) is None


def test_reads_follow_a_moved_shard(
    citus_cluster: Cluster, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = citus_cluster.workers[:2]
    name = citus_cluster.names_on(source, "moved", 1)[0]
    _label(engine, name, 42)
    assert _read(engine, name) == (source.port, "42")

    with engine.connect() as conn:
        shard = conn.execute(_SHARD_OF_KEY, {"key": shard_key(name)}).scalar_one()
    admin = sa.create_engine(citus_cluster.url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(_MOVE, {"shard": shard, "source": source.port, "target": target.port})
        # Before the placement is read again: the old node still answers, rightly.
        assert _read(engine, name)[1] == "42"

        monkeypatch.setattr(routing, "REFRESH", 0.0)  # the next read reads the placement
        assert _read(engine, name) == (target.port, "42")
    finally:
        with admin.connect() as conn:  # back where it was, for the tests after this one
            conn.execute(_MOVE, {"shard": shard, "source": target.port, "target": source.port})
        admin.dispose()


def test_a_node_not_reached_is_read_through_the_coordinator_then_tried_again(
    citus_cluster: Cluster, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = citus_cluster.workers[0]
    name = citus_cluster.names_on(node, "away", 1)[0]
    _label(engine, name, 5)
    found = nodes_of(engine)
    assert found is not None
    routed = found.engine_for(shard_key(name))
    assert routed.url.port == node.port

    error = refused_connection()
    found.unreachable(routed, error)  # as near() does when the node refuses

    assert _read(engine, name) == (citus_cluster.coordinator.port, "5")
    assert [
        route.reachable for route in found.routes() if route.address.endswith(f":{node.port}")
    ] == [False]

    monkeypatch.setattr(routing, "RETRY_DOWN", 0.0)
    found.unreachable(routed, error)  # down for no time at all: tried again at once
    assert _read(engine, name) == (node.port, "5")
