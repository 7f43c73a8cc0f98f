"""A pull claim that a shard move cuts short is made again, unseen by the worker (SPEC F1).

On Citus a claim's statement is run in steps: its first step locks the oldest
due labels on the shard's node, and hands them to the next (the lease) as an
intermediate result sent to that node. A shard move that commits while the
lease waits for the shard's lock sends the lease to the shard's new node, where
that result never arrived: Citus fails the statement ("could not find the
intermediate result file", SQLSTATE CIINF) and rolls the transaction back. The
service runs such a transaction again (routemaster/service/shard_moves.py), so
a worker claiming while an operator rebalances gets its tasks, not a 500.

The moment is made on purpose: the shard's metadata lock is taken as a move
takes it, a claim starts and waits for it after its first step, and the shard
is moved in the same transaction as the lock, which then commits.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db import transitions
from routemaster.db.keys import shard_key
from routemaster.service.tasks import claim_tasks
from tests.api.test_shard_move_citus import move, placement
from tests.citus_cluster import Cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.citus

CONFIG = """
state_machines:
  jobs:
    states:
      - action: pull
        worker: {lease: 30s}
        next: done
      - gate: done
        exit_condition: false
"""

_SHARD_OF_KEY = sa.text("SELECT get_shard_id_for_distribution_column('labels', :key)")
# ExclusiveLock (7) on the shard's placement metadata: what a move holds while it switches.
_HOLD_AS_A_MOVE = sa.text("SELECT lock_shard_metadata(7, ARRAY[CAST(:shard AS bigint)])")
_CLAIMS_WAITING = sa.text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    " AND wait_event = 'advisory' AND query LIKE '%%WITH pulled AS%%'"
)


def test_a_claim_cut_short_by_a_shard_move_is_made_again(
    citus_cluster: Cluster, tmp_path: Path
) -> None:
    engine = citus_cluster.engine
    config = tmp_path / "jobs.yaml"
    config.write_text(CONFIG)
    app = App(config=load_config([config]), db=engine)
    with engine.begin() as conn:
        assert transitions.insert(conn, "jobs", "j1", {}, state="pull", now=app.now(), due=True)
        shard = int(conn.execute(_SHARD_OF_KEY, {"key": shard_key("j1")}).scalar_one())
    source = placement(engine, shard)
    target = next(node for node in citus_cluster.workers if node != source)

    with engine.connect() as mover, ThreadPoolExecutor(1) as pool:
        mover.execute(_HOLD_AS_A_MOVE, {"shard": shard})
        claim = pool.submit(
            claim_tasks, app, [("jobs", "pull")], worker="w", limit=1, rng=random.Random()
        )
        wait_until(lambda: _count(engine, _CLAIMS_WAITING) == 1, timeout=30)
        move(engine, shard, target, "block_writes", conn=mover)  # commits: the claim goes on
        tasks = claim.result(timeout=60)

    assert placement(engine, shard) == target
    assert [task.label for task in tasks] == ["j1"]
    with engine.connect() as conn:  # leased where the label is now
        leased = conn.execute(
            sa.text("SELECT task_id FROM labels WHERE name = 'j1' AND lease_owner = 'w'")
        ).scalar_one()
    assert leased == tasks[0].id


def _count(engine: sa.Engine, statement: sa.TextClause) -> int:
    with engine.connect() as conn:
        return int(conn.execute(statement).scalar_one())
