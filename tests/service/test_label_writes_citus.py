"""On Citus, a write of one label runs on the node holding it, and the changes stream stays exact.

A create, an update, a delete, a pull task's completion run on the node
holding the label's shard; the coordinator only gives their history rows its
transaction id (routemaster/db/nodes.py). These tests drive the service as
the API does, on a real cluster, and check what users rely on: writers of one
label racing each other come out of the changes stream in the order they
wrote, each change once; a write that makes work due wakes the workers
listening on the coordinator; with routing off, or the node out of reach,
writes go through the coordinator as before.

Runs when ``ROUTEMASTER_TEST_CITUS_URL`` names a Citus coordinator; skipped otherwise.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import generate_latest

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.changes import START, Change, read_changes
from routemaster.db.keys import shard_key
from routemaster.db.nodes import dispose_nodes, nodes_of, route_writes
from routemaster.db.plumbing.database import create_engine
from routemaster.metrics import Metrics
from routemaster.service.labels import create_label, delete_label, get_label, update_metadata
from tests.citus_cluster import Cluster, refused_connection
from tests.waiting import wait_until

pytestmark = pytest.mark.citus

GATES = 12

CONFIG = (
    "state_machines:\n  steps:\n    states:\n"
    + "".join(
        f"      - gate: g{i}\n"
        f"        triggers: [{{metadata: n}}]\n"
        f"        exit_condition: metadata.n >= {i + 1}\n"
        f"        next: g{i + 1}\n"
        for i in range(GATES)
    )
    + f"      - gate: g{GATES}\n        exit_condition: false\n"
    + """  jobs:
    states:
      - action: call
        webhook: http://127.0.0.1:9/never
        next: done
      - gate: done
        exit_condition: false
"""
)

_WHERE_HISTORY_WAS_WRITTEN = sa.text(
    "SELECT label, CAST(xact_id AS text) FROM history WHERE state_machine = :sm"
)


@pytest.fixture
def app(citus_cluster: Cluster, tmp_path: Path) -> Iterator[App]:
    """The service on the cluster's coordinator, with its own engine (node pools disposed)."""
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    engine = create_engine(citus_cluster.url, pool_size=8)
    made = App(config=load_config([path]), db=engine, metrics=Metrics())
    yield made
    dispose_nodes(engine)
    engine.dispose()


def _whole_stream(app: App, expected: int) -> list[Change]:
    """Every change of the stream from the start, read a page at a time until ``expected``."""
    found: list[Change] = []
    position = START

    def more() -> bool:
        nonlocal position
        with app.db.connect() as conn:
            page = read_changes(conn, position, machine=None, limit=100, horizon=app.horizon)
        found.extend(page.changes)
        position = page.reached
        return len(found) >= expected

    wait_until(more, lambda: f"{len(found)} of {expected} changes", timeout=30)
    return found


def test_racing_writers_of_one_label_come_out_of_the_stream_in_their_order(
    citus_cluster: Cluster, app: App
) -> None:
    names = [
        name
        for worker in citus_cluster.workers
        for name in citus_cluster.names_on(worker, "race", 3)
    ]
    machine = app.config.get_machine("steps")
    for name in names:
        create_label(app, machine, name, {"n": 0})
    updates = [(name, n) for name in names for n in range(1, GATES + 1)]
    random.Random(7).shuffle(updates)

    def update(item: tuple[str, int]) -> None:
        update_metadata(app, machine, item[0], {"n": item[1]})

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(update, updates))

    with app.db.connect() as conn:
        written = conn.execute(_WHERE_HISTORY_WAS_WRITTEN, {"sm": "steps"}).all()
    stream = [change for change in _whole_stream(app, len(written)) if change.label in names]
    assert sorted((c.label, str(c.position.xact)) for c in stream) == sorted(
        (label, xact) for label, xact in written
    ), "every history row once, with the coordinator's transaction id it was written with"
    for name in names:
        chain = [(c.old_state, c.new_state) for c in stream if c.label == name]
        # created in g0, then each move from where the one before left it, to where it is
        assert chain[0] == (None, "g0")
        assert all(after[0] == before[1] for before, after in itertools.pairwise(chain))
        assert chain[-1][1] == get_label(app, machine, name).state
        assert len(chain) > 3  # the racing updates moved it, several times
    exposed = generate_latest(app.metrics.registry()).decode() if app.metrics else ""
    assert f'routemaster_label_writes_total{{route="node"}} {len(names) + len(updates)}.0' in (
        exposed
    )


def test_a_write_that_makes_work_due_wakes_the_workers_on_the_coordinator(
    citus_cluster: Cluster, app: App
) -> None:
    listening = sa.create_engine(citus_cluster.url, isolation_level="AUTOCOMMIT")
    raw = listening.raw_connection()
    listener: Any = raw.driver_connection
    try:
        listener.cursor().execute("LISTEN routemaster_due")
        name = citus_cluster.names_on(citus_cluster.workers[0], "woken", 1)[0]
        create_label(app, app.config.get_machine("jobs"), name, {})

        def heard() -> bool:
            listener.poll()
            return any(n.channel == "routemaster_due" for n in listener.notifies)

        wait_until(heard, "the NOTIFY of a label entering an action")
    finally:
        raw.close()
        listening.dispose()


def test_with_routing_off_or_the_node_away_writes_go_through_the_coordinator(
    citus_cluster: Cluster, app: App
) -> None:
    machine = app.config.get_machine("steps")
    node = citus_cluster.workers[1]
    first, second = citus_cluster.names_on(node, "away", 2)

    route_writes(app.db, on=False)
    create_label(app, machine, first, {"n": 0})
    update_metadata(app, machine, first, {"n": 2})

    route_writes(app.db, on=True)
    found = nodes_of(app.db)
    assert found is not None
    routed = found.engine_for(shard_key(second))
    assert routed.url.port == node.port
    found.unreachable(routed, refused_connection())  # as a failed connection to it does
    create_label(app, machine, second, {"n": 1})
    delete_label(app, machine, second)

    exposed = generate_latest(app.metrics.registry()).decode() if app.metrics else ""
    assert 'routemaster_label_writes_total{route="database"} 4.0' in exposed
    assert 'routemaster_label_writes_total{route="node"}' not in exposed
    changes = _whole_stream(app, 4)
    assert [(c.label, c.old_state, c.new_state) for c in changes] == [
        (first, None, "g0"),
        (first, "g0", "g1"),  # one gate a trigger (the next is not evaluated on entry)
        (second, None, "g0"),
        (second, "g0", None),
    ]
