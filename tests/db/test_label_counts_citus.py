"""Kept label counts on Citus: seeded by migrate on the shards, folded below the horizon the
workers confirm, exact while a transaction's second worker has not committed yet.

Runs only with ``ROUTEMASTER_TEST_CITUS_URL`` (tests/citus_cluster.py).
"""

from __future__ import annotations

import datetime

import pytest
import sqlalchemy as sa

from routemaster.db import label_counts, transitions
from routemaster.db import labels as store
from routemaster.db.horizon import Horizon
from routemaster.db.labels import Moves
from routemaster.db.upgrade import keep_counts
from tests.citus_cluster import Cluster, second_worker_held
from tests.waiting import wait_until

NOW = datetime.datetime(2026, 11, 28, 5, 0, tzinfo=datetime.UTC)

_COUNTED = """
    SELECT state_machine, state, count(*) FROM labels WHERE NOT deleted
    GROUP BY state_machine, state
    """


@pytest.fixture
def cluster(citus_cluster: Cluster) -> Cluster:
    return citus_cluster


@pytest.fixture
def engine(citus_cluster: Cluster) -> sa.Engine:
    return citus_cluster.engine


def counted(engine: sa.Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        return {(sm, state): int(n) for sm, state, n in conn.exec_driver_sql(_COUNTED)}


def kept(engine: sa.Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        found = label_counts.kept_per_state(conn)
    assert found is not None, "migrate seeds the counts on Citus too"
    return found


def fold(engine: sa.Engine, horizon: Horizon) -> int:
    with engine.begin() as conn:
        return label_counts.fold(conn, horizon.confirmed(conn))


def _create(conn: sa.Connection, name: str) -> None:
    assert transitions.insert(conn, "m", name, {}, state="a", now=NOW) is not None


def test_counts_stay_exact_across_shards_through_moves_deletes_and_a_recount(
    cluster: Cluster, engine: sa.Engine
) -> None:
    first, second = cluster.workers[:2]
    names = cluster.names_on(first, "one", 3) + cluster.names_on(second, "two", 3)
    for name in names:
        with engine.begin() as conn:
            _create(conn, name)
    with engine.begin() as conn:  # one transaction moving labels on both workers
        locked = [store.lock(conn, "m", name) for name in names[2:5]]
        transitions.write_moves(
            conn, [Moves(label, ("b",), due_at=None) for label in locked if label], now=NOW
        )
    with engine.begin() as conn:
        transitions.soft_delete(conn, "m", names[0], now=NOW)
    assert kept(engine) == {("m", "a"): 2, ("m", "b"): 3} == counted(engine)
    horizon = Horizon()
    wait_until(lambda: fold(engine, horizon) > 0, "a fold", timeout=30)
    assert kept(engine) == counted(engine)
    assert keep_counts(engine, recount=True)
    assert kept(engine) == {("m", "a"): 2, ("m", "b"): 3} == counted(engine)


def test_a_fold_waits_for_a_transaction_whose_second_worker_has_not_committed(
    cluster: Cluster, engine: sa.Engine
) -> None:
    first, second = cluster.workers[:2]
    [early] = cluster.names_on(first, "held-one", 1)
    [held] = cluster.names_on(second, "held-two", 1)
    horizon = Horizon()
    with engine.connect() as writer:
        writer.begin()
        _create(writer, held)
        _create(writer, early)
        with second_worker_held(cluster, writer, second) as moment:
            with engine.begin() as conn:
                _create(conn, "later")
            fold(engine, horizon)
            with engine.connect() as conn:
                position = conn.exec_driver_sql(
                    "SELECT CAST(CAST(xact AS text) AS bigint) FROM label_counts_folded"
                ).scalar_one()
            assert position <= moment.xact  # not past the rows still invisible
            assert kept(engine) == counted(engine)
        wait_until(moment.committed.is_set, "the writer's commit returned", timeout=30)
    assert kept(engine) == {("m", "a"): 3} == counted(engine)
    wait_until(
        lambda: fold(engine, horizon) >= 0 and _folded_past(engine, moment.xact),
        "a fold past the writer",
        timeout=30,
    )
    assert kept(engine) == {("m", "a"): 3} == counted(engine)


def _folded_past(engine: sa.Engine, xact: int) -> bool:
    with engine.connect() as conn:
        position = conn.exec_driver_sql(
            "SELECT CAST(CAST(xact AS text) AS bigint) FROM label_counts_folded"
        ).scalar_one()
    return int(position) > xact
