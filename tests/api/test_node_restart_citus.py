"""A worker node that goes down and comes back is survived like a database outage (SPEC F1).

``serve`` (the API and its worker) runs on the coordinator of a Citus cluster while one worker
node is stopped and started again (``pg_ctl``): the requests that need that node answer the
same 503 JSON as when the whole database is unreachable, the labels on the other node are
served throughout, nothing already accepted is lost, and the work waiting on the stopped node
(a webhook delivery finishing as it went down, labels waiting for their delivery) is done once
it is back, with at most the at-least-once repeat of a delivery (one idempotency token).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from tests.citus_cluster import Node, Server, worker_nodes
from tests.serving import serve_process
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.citus, pytest.mark.slow, pytest.mark.timeout(300)]

CONFIG = """
state_machines:
  m:
    retry: {max_attempts: 100, initial_delay: 1s, max_delay: 1s}
    states:
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: done
      - gate: done
        exit_condition: false
"""
LABELS = "/state-machines/m/labels"
UNREACHABLE = {"message": "Cannot connect to database"}

_NODE_OF_LABEL = sa.text(
    "SELECT n.nodename, n.nodeport FROM labels AS l"
    " JOIN pg_dist_placement AS p"
    " ON p.shardid = get_shard_id_for_distribution_column('labels', l.shard_key)"
    " JOIN pg_dist_node AS n USING (groupid) WHERE l.name = :name"
)
_TRANSITIONS = sa.text("SELECT label, old_state, new_state FROM history")


@pytest.fixture
def served(
    tmp_path: Path, database_url: str, db_engine: sa.Engine, stub: StubServer
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    config = tmp_path / "m.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    with serve_process(
        config,
        database_url,
        "--workers",
        "2",
        with_worker=True,
        log=tmp_path / "serve.log",
    ) as running:
        yield running


def node_of(engine: sa.Engine, name: str) -> Node:
    with engine.connect() as conn:
        host, port = conn.execute(_NODE_OF_LABEL, {"name": name}).one()
    return Node(host, int(port))


def create(base: str, name: str) -> requests.Response:
    return requests.post(f"{base}{LABELS}/{name}", json={"metadata": {}}, timeout=30)


def state(base: str, name: str) -> str | None:
    answer = requests.get(f"{base}{LABELS}/{name}", timeout=30)
    return str(answer.json()["state"]) if answer.status_code == 200 else None


def test_a_worker_node_restart_loses_nothing_and_answers_like_an_outage(
    served: tuple[subprocess.Popen[bytes], str],
    database_url: str,
    db_engine: sa.Engine,
    stub: StubServer,
    tmp_path: Path,
) -> None:
    process, base = served
    url = sa.engine.make_url(database_url)
    # Labels on both nodes, delivered before anything happens.
    for index in range(12):
        assert create(base, f"before{index}").status_code == 201
    wait_until(lambda: all(state(base, f"before{i}") == "done" for i in range(12)), timeout=30)
    homes = {f"before{i}": node_of(db_engine, f"before{i}") for i in range(12)}
    down_node = worker_nodes(url)[0]
    on_down = sorted(name for name, node in homes.items() if node == down_node)
    on_up = sorted(name for name, node in homes.items() if node != down_node)
    assert on_down and on_up, f"labels on both worker nodes: {homes}"

    # A delivery in flight when the node goes down (its answer comes while it is down), and
    # labels that wait for their delivery on it.
    stub.script("/hook/slow", Reply(200, delay=3))
    waiting = [f"waiting{i}" for i in range(6)]
    for name in waiting:
        stub.script(f"/hook/{name}", Reply(503))  # not delivered before the node goes down
    assert create(base, "slow").status_code == 201
    for name in waiting:
        assert create(base, name).status_code == 201
    stub.wait_for(lambda: bool(stub.received("/hook/slow")), timeout=30)

    server = Server.at(down_node.url(url, url.database or "postgres"))
    server.stop()
    try:
        for name in waiting:
            stub.script(f"/hook/{name}", Reply(200))
        answer = requests.get(f"{base}{LABELS}/{on_down[0]}", timeout=30)
        assert (answer.status_code, answer.json()) == (503, UNREACHABLE)
        answer = requests.patch(
            f"{base}{LABELS}/{on_down[0]}", json={"metadata": {"x": 1}}, timeout=30
        )
        assert (answer.status_code, answer.json()) == (503, UNREACHABLE)
        # The other node's labels are served throughout.
        answer = requests.get(f"{base}{LABELS}/{on_up[0]}", timeout=30)
        assert answer.status_code == 200, answer.text
        assert process.poll() is None
    finally:
        server.start()

    wait_until(
        lambda: requests.get(f"{base}{LABELS}/{on_down[0]}", timeout=30).status_code == 200,
        "the labels on the restarted node served again",
        timeout=60,
    )
    created_after = [f"after{i}" for i in range(6)]
    for name in created_after:
        assert create(base, name).status_code == 201
    everything = [*homes, "slow", *waiting, *created_after]
    wait_until(
        lambda: [name for name in everything if state(base, name) != "done"] == [],
        lambda: f"not done: {[n for n in everything if state(base, n) != 'done']}",
        timeout=90,
    )
    assert process.poll() is None, "serve and its worker rode out the node's restart"

    with db_engine.connect() as conn:
        transitions = Counter(tuple(row) for row in conn.execute(_TRANSITIONS))
    assert set(transitions) == {(name, None, "notify") for name in everything} | {
        (name, "notify", "done") for name in everything
    }
    assert set(transitions.values()) == {1}, "no transition twice"
    for name in everything:
        calls = stub.received(f"/hook/{name}")
        assert calls, f"{name} delivered"
        tokens = {call.headers["X-Idempotency-Token"] for call in calls}
        assert len(tokens) == 1, f"{name}: one delivery, repeated at most with its token"
