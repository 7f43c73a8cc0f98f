"""On Citus, a child finishing stays a one-shard commit (SPEC G3): the parent on another
worker is never written in the child's transaction, and the tables of children are
distributed co-located with ``labels``.

Runs when ``ROUTEMASTER_TEST_CITUS_URL`` names a Citus coordinator; skipped otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.keys import shard_key
from routemaster.db.nodes import nodes_of
from routemaster.service.children import run_spawns, wake_parents
from tests.citus_cluster import Cluster
from tests.db.test_routing_citus import _NODE, Recorded, _commit_records, _explained, _workers
from tests.worker.children import config

pytestmark = pytest.mark.citus

_COLOCATED = sa.text(
    "SELECT CAST(logicalrelid AS text), colocationid FROM pg_dist_partition"
    " WHERE logicalrelid IN ('labels'::regclass, 'children'::regclass, 'spawns'::regclass,"
    " 'child_wakes'::regclass)"
)


def test_the_tables_of_children_are_colocated_with_labels(citus_cluster: Cluster) -> None:
    with citus_cluster.engine.connect() as conn:
        groups = {str(table): int(group) for table, group in conn.execute(_COLOCATED)}
    assert set(groups) == {"labels", "children", "spawns", "child_wakes"}
    assert len(set(groups.values())) == 1


def test_a_child_finishing_commits_on_its_own_shard_alone(
    citus_cluster: Cluster, tmp_path: Path
) -> None:
    engine = citus_cluster.engine
    path = tmp_path / "config.yaml"
    path.write_text(config())
    app = App(config=load_config([path]), db=engine)
    order, item = app.config.get_machine("order"), app.config.get_machine("item")
    parent, child = next(
        (name, f"{name}/0")
        for name in (f"o{n}" for n in range(1000))
        if citus_cluster.worker_of(name) != citus_cluster.worker_of(f"{name}/0")
    )
    service.create_label(app, order, parent, {"items": ["a"]})
    while run_spawns(app, limit=10):
        pass
    workers = _workers(engine)
    nodes = nodes_of(engine)
    assert nodes is not None
    on_its_node = nodes.engine_for(shard_key(child))  # where the child's update runs
    records = _commit_records(engine)
    with Recorded(engine, on_its_node) as recorded:
        moved = service.update_metadata(app, item, child, {"ok": True})
    assert moved.state == "picked"
    added = _commit_records(engine) - records
    assert not added, f"the child's finish committed in two phases ({sorted(added)})"
    statements = [statement for _, statement, _ in recorded.statements]
    assert any("UPDATE children" in statement for statement in statements)
    assert any("INSERT INTO child_wakes" in statement for statement in statements)
    for ran_on, statement, params in recorded.statements:
        plan = _explained(ran_on, statement, params)
        shards = {node for node in _NODE.findall(plan) if node in workers}
        assert len(shards) == 1, (statement, plan)
        assert ran_on is on_its_node, statement
    # ... and the parent, on another worker, hears of it: its word taken, it decides.
    assert wake_parents(app, limit=10) == 1
    assert run_spawns(app, limit=10) == 1
    assert service.get_label(app, order, parent).state == "done"
