"""A Citus cluster for tests (``ROUTEMASTER_TEST_CITUS_URL``), and a two-phase commit held half-way.

``ROUTEMASTER_TEST_CITUS_URL`` names a database on a Citus coordinator
(``../shared/citus/cluster.sh`` prints one). :func:`fresh_cluster_database`
makes a database of its own on the coordinator and on every worker, with
the citus extension and the nodes added, migrates it (``routemaster
migrate`` distributes it) and drops it afterwards, as ``tests/conftest.py``
does on one server.

:func:`second_worker_held` makes the moment the changes stream must survive:
a transaction that wrote to two workers has committed on the coordinator and
on one worker, while the other worker's ``COMMIT PREPARED`` has not run yet.
The coordinator is made to wait between ``PREPARE`` and its own commit
(synchronous replication to a standby that never comes, for this one
transaction), the writer's backend on the held worker is stopped
(``SIGSTOP``: the cluster must run on this machine, under a user this
process may signal), and the coordinator let go: it commits and sends
``COMMIT PREPARED``, which the stopped backend runs only when continued.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.db.horizon import Horizon
from routemaster.db.keys import SHARD_KEYS, shard_key
from routemaster.db.plumbing.database import create_engine, normalise_url
from routemaster.db.plumbing.migrate import upgrade
from tests.waiting import wait_until

CITUS_URL = "ROUTEMASTER_TEST_CITUS_URL"


@dataclass(frozen=True)
class Node:
    group: int
    host: str
    port: int


@dataclass
class Cluster:
    url: str  # the test's own database, on the coordinator
    engine: sa.Engine
    coordinator: Node
    workers: list[Node]
    user: str | None
    database: str

    def url_of(self, node: Node) -> sa.URL:
        return _url(node, self.database, self.user)

    def query(self, node: Node, sql: str, *args: Any) -> list[Any]:
        """One statement in autocommit on ``node``'s test database; its rows."""
        return _query(self.url_of(node), sql, *args)

    def worker_of(self, name: str) -> Node:
        """The worker holding the label ``name``'s shard (where it is now: shards move)."""
        ports = dict(
            self.query(
                self.coordinator,
                "SELECT k, nodeport FROM generate_series(0, %s) AS k JOIN citus_shards"
                " ON shardid = get_shard_id_for_distribution_column('history', k)",
                SHARD_KEYS - 1,
            )
        )
        return next(node for node in self.workers if node.port == ports[shard_key(name)])

    def names_on(self, node: Node, prefix: str, count: int) -> list[str]:
        """``count`` label names (``prefix-N``) whose shards are on ``node``."""
        ports = dict(
            self.query(
                self.coordinator,
                "SELECT k, nodeport FROM generate_series(0, %s) AS k JOIN citus_shards"
                " ON shardid = get_shard_id_for_distribution_column('history', k)",
                SHARD_KEYS - 1,
            )
        )
        names = (f"{prefix}-{n}" for n in range(10_000))
        return [name for name in names if ports[shard_key(name)] == node.port][:count]


def _url(node: Node, database: str, user: str | None) -> sa.URL:
    return sa.URL.create(
        "postgresql+psycopg2", username=user, host=node.host, port=node.port, database=database
    )


def _connect(url: sa.URL) -> sa.Connection:
    """A connection of its own in autocommit (closing it closes the session)."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    return engine.connect()


def _query(url: sa.URL, sql: str, *args: Any) -> list[Any]:
    """One statement in autocommit; its rows (none for a command)."""
    with _connect(url) as conn:
        result = conn.exec_driver_sql(sql, args) if args else conn.exec_driver_sql(sql)
        return list(result.all()) if result.returns_rows else []


def citus_url() -> str:
    url = os.environ.get(CITUS_URL)
    if not url:
        pytest.skip(f"{CITUS_URL} names no Citus coordinator")
    return normalise_url(url)


@contextlib.contextmanager
def fresh_cluster_database() -> Iterator[Cluster]:
    """A new database on every node of the cluster, migrated (distributed); dropped after."""
    given = sa.engine.make_url(citus_url())
    name = f"routemaster_test_{uuid.uuid4().hex[:10]}"
    host, port = given.host or "127.0.0.1", given.port or 5432
    coordinator = Node(0, host, port)
    user = given.username
    rows = _query(
        _url(coordinator, given.database or "postgres", user),
        "SELECT groupid, nodename, nodeport FROM pg_dist_node"
        " WHERE noderole = 'primary' AND groupid <> 0 ORDER BY groupid",
    )
    workers = [Node(group, node_host, node_port) for group, node_host, node_port in rows]
    for node in [*workers, coordinator]:
        _query(_url(node, "postgres", user), f'CREATE DATABASE "{name}"')
        _query(_url(node, name, user), "CREATE EXTENSION citus")
    here = _url(coordinator, name, user)
    _query(here, "SELECT citus_set_coordinator_host(%s, %s)", host, port)
    for node in workers:
        _query(here, "SELECT citus_add_node(%s, %s)", node.host, node.port)
    url = given.set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        upgrade(engine)
        yield Cluster(url, engine, coordinator, workers, user, name)
    finally:
        engine.dispose()
        for node in [coordinator, *workers]:
            _query(_url(node, "postgres", user), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Held:
    xact: int  # the writer's coordinator transaction id
    worker: Node  # the worker whose COMMIT PREPARED waits
    committed: threading.Event  # the writer's COMMIT returned


@contextlib.contextmanager
def second_worker_held(
    cluster: Cluster, writer: sa.Connection, worker: Node, *, lose: bool = False
) -> Iterator[Held]:
    """Commit ``writer``'s open transaction (it wrote to ``worker`` and another worker), holding
    ``worker``'s ``COMMIT PREPARED`` back until the block ends; the coordinator has committed
    when the block starts.

    ``lose``: instead of stopping the writer's backend on ``worker``, end it
    (``pg_terminate_backend``: no signal of ours, so the cluster may be
    anywhere). ``COMMIT PREPARED`` then fails, the coordinator's commit returns
    all the same, and the transaction stays prepared on ``worker`` until Citus
    recovers it (``recover_prepared_transactions()``, or its maintenance
    daemon, every ``citus.recover_2pc_interval``).
    """
    coordinator = cluster.coordinator
    xact, gpid, pid = writer.exec_driver_sql(
        "SELECT CAST(pg_current_xact_id() AS text), citus_backend_gpid(), pg_backend_pid()"
    ).one()
    backends = [
        row[0]
        for row in cluster.query(
            worker,
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            f"citus_internal gpid={gpid}",
        )
    ]
    assert backends, "the writer has no connection to the worker to hold"
    try:
        for backend in [] if lose else backends:
            os.kill(backend, 0)
    except (PermissionError, ProcessLookupError):
        pytest.skip("the Citus worker's processes are not on this machine, or not ours to signal")
    writer.exec_driver_sql("SET LOCAL synchronous_commit = on")
    committed = threading.Event()
    stopped: list[int] = []
    threads: list[threading.Thread] = []
    cluster.query(coordinator, "ALTER SYSTEM SET synchronous_standby_names = 'never_there'")
    try:
        cluster.query(coordinator, "SELECT pg_reload_conf()")
        threads.append(_wait_for_synchronous_replication(cluster))

        def commit() -> None:
            writer.commit()
            committed.set()

        threads.append(threading.Thread(target=commit, daemon=True))
        threads[-1].start()
        wait_until(
            lambda: cluster.query(
                coordinator,
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'",
                pid,
            ),
            "the writer prepared on the workers, waiting to commit on the coordinator",
            timeout=20,
        )
        for backend in backends:
            if lose:
                cluster.query(worker, "SELECT pg_terminate_backend(%s, 10000)", backend)
            else:
                os.kill(backend, signal.SIGSTOP)
                stopped.append(backend)
        _release_synchronous_replication(cluster)
        wait_until(
            lambda: _coordinator_horizon(cluster) > int(xact),
            "the writer committed on the coordinator",
            timeout=20,
        )
        yield Held(int(xact), worker, committed)
    finally:
        for backend in stopped:
            os.kill(backend, signal.SIGCONT)
        _release_synchronous_replication(cluster)
        for thread in threads:
            thread.join(timeout=30)


def _wait_for_synchronous_replication(cluster: Cluster) -> threading.Thread:
    """Until a commit that writes WAL waits for the standby: the setting is in force.

    (The checkpointer applies it after the reload; a commit's wait depends on
    its having done so.) The probe's own commit goes on waiting until released.
    """
    probe = _connect(cluster.url_of(cluster.coordinator))
    pid = probe.exec_driver_sql("SELECT pg_backend_pid()").scalar()

    def commit() -> None:
        try:
            probe.exec_driver_sql(
                "SET synchronous_commit = on; BEGIN;"
                " CREATE TEMP TABLE sync_probe (x int); DROP TABLE sync_probe; COMMIT"
            )
        finally:
            probe.close()

    def waiting() -> bool:
        return bool(
            cluster.query(
                cluster.coordinator,
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'",
                pid,
            )
        )

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    if not wait_until(lambda: waiting() or not thread.is_alive(), timeout=10) or not waiting():
        thread.join()
        return _wait_for_synchronous_replication(cluster)  # committed before it applied
    return thread


def _release_synchronous_replication(cluster: Cluster) -> None:
    cluster.query(cluster.coordinator, "ALTER SYSTEM RESET synchronous_standby_names")
    cluster.query(cluster.coordinator, "SELECT pg_reload_conf()")


def _coordinator_horizon(cluster: Cluster) -> int:
    with cluster.engine.connect() as conn:
        return Horizon.coordinator(conn)


def rounds_pass(horizon: Horizon, rounds: int, read: Callable[[], object]) -> None:
    """Call ``read`` until ``horizon`` has asked the workers ``rounds`` more times."""
    target = horizon.rounds.worker_rounds + rounds

    def done() -> bool:
        read()
        return horizon.rounds.worker_rounds >= target

    wait_until(done, f"{rounds} confirmation rounds", timeout=30, every=0.05)
