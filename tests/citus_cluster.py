"""The Citus cluster tests run on (SPEC F1): a database of their own on it, and what tests do to it.

``ROUTEMASTER_TEST_CITUS_URL`` names a database on a Citus coordinator
(``../shared/citus/cluster.sh start`` prints one; ``scripts/test --citus``
starts a cluster and sets it). Set, the test session's database is a Citus
one (tests/conftest.py): :func:`fresh_cluster_database` makes it on the
coordinator and on every worker node the coordinator lists in
``pg_dist_node``, creates the extension on each, adds the workers, migrates it
as ``routemaster migrate`` does (which distributes the tables) and drops it on
every node afterwards. The ``citus_cluster`` fixture gives tests that session
database as a :class:`Cluster` (its nodes, statements on one node, label
names per node, shard counts); tests that only mean something on Citus carry
the ``citus`` marker and are skipped on plain PostgreSQL. Unset, nothing here
runs and the session uses plain PostgreSQL.

:class:`Server` stops and starts one node (``pg_ctl``). :func:`second_worker_held`
makes the moment the changes stream must survive: a transaction that wrote to
two workers has committed on the coordinator and on one worker, while the
other worker's ``COMMIT PREPARED`` has not run yet. The coordinator is made to
wait between ``PREPARE`` and its own commit (synchronous replication to a
standby that never comes, for this one transaction), the writer's backend on
the held worker is stopped (``SIGSTOP``: the cluster must run on this machine,
under a user this process may signal), and the coordinator let go: it commits
and sends ``COMMIT PREPARED``, which the stopped backend runs only when continued.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from routemaster.db.horizon import Horizon
from routemaster.db.keys import SHARD_KEYS, shard_key
from routemaster.db.plumbing.database import create_engine, normalise_url
from routemaster.db.upgrade import upgrade
from tests.waiting import wait_until

CITUS_URL = "ROUTEMASTER_TEST_CITUS_URL"
"""A Citus coordinator's URL (any database of the cluster that lists the workers)."""

T = TypeVar("T")

_WORKER_NODES = sa.text(
    "SELECT nodename, nodeport FROM pg_dist_node"
    " WHERE noderole = 'primary' AND groupid <> 0 ORDER BY nodeid"
)
_CREATE_EXTENSION = sa.text("CREATE EXTENSION IF NOT EXISTS citus")
_SET_COORDINATOR = sa.text("SELECT citus_set_coordinator_host(:host, :port)")
_ADD_NODE = sa.text("SELECT citus_add_node(:host, :port)")
_PREPARED_HERE = sa.text("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
_DATA_DIRECTORY = sa.text("SELECT current_setting('data_directory')")
_SERVER_VERSION = sa.text("SELECT current_setting('server_version_num')::int / 10000")
# Each shard key's worker port (the shards of labels, history... are co-located).
_PORT_OF_KEY = (
    "SELECT k, nodeport FROM generate_series(0, %s) AS k JOIN citus_shards"
    " ON shardid = get_shard_id_for_distribution_column('history', k)"
)


def citus_run() -> bool:
    """Whether this test session's database is on a Citus cluster."""
    return bool(os.environ.get(CITUS_URL))


def coordinator_url() -> str:
    """The coordinator named by ``ROUTEMASTER_TEST_CITUS_URL``, as SQLAlchemy wants it
    (the test is skipped when it is not set)."""
    url = os.environ.get(CITUS_URL)
    if not url:
        pytest.skip(f"{CITUS_URL} names no Citus coordinator")
    return normalise_url(url)


@dataclass(frozen=True)
class Node:
    """One PostgreSQL server of the cluster."""

    host: str
    port: int

    def url(self, template: sa.URL, database: str) -> sa.URL:
        """``template`` (user, driver) pointed at this node's ``database``."""
        return template.set(host=self.host, port=self.port, database=database)


def _admin(url: sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _query(url: sa.URL, sql: str, *args: Any) -> list[Any]:
    """One statement in autocommit; its rows (none for a command)."""
    engine = _admin(url)
    try:
        with engine.connect() as conn:
            result = conn.exec_driver_sql(sql, args) if args else conn.exec_driver_sql(sql)
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def _connect(url: sa.URL) -> sa.Connection:
    """A connection of its own in autocommit (closing it closes the session)."""
    return _admin(url).connect()


def _on_each(nodes: Sequence[Node], work: Callable[[Node], T]) -> list[T]:
    """``work`` on every node at once: each is a separate server, and CREATE DATABASE or
    CREATE EXTENSION citus takes a second or so on each."""
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return list(pool.map(work, nodes))


def worker_nodes(coordinator: sa.URL) -> list[Node]:
    """The worker nodes the coordinator's database (the one in its URL) lists."""
    engine = _admin(coordinator)
    try:
        with engine.connect() as conn:
            return [Node(host, int(port)) for host, port in conn.execute(_WORKER_NODES)]
    finally:
        engine.dispose()


@dataclass
class Cluster:
    """A database made on every node of the cluster: the coordinator first, then the workers."""

    template: sa.URL
    name: str
    coordinator: Node
    workers: tuple[Node, ...]

    @property
    def url(self) -> str:
        """The coordinator's URL for this database: what the service is given."""
        return self.coordinator.url(self.template, self.name).render_as_string(hide_password=False)

    @functools.cached_property
    def engine(self) -> sa.Engine:
        """An engine on :attr:`url` (disposed by :func:`fresh_cluster_database`)."""
        return create_engine(self.url)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.coordinator, *self.workers)

    def node_url(self, node: Node) -> sa.URL:
        return node.url(self.template, self.name)

    def query(self, node: Node, sql: str, *args: Any) -> list[Any]:
        """One statement in autocommit on ``node``'s copy of the database; its rows."""
        return _query(self.node_url(node), sql, *args)

    def worker_of(self, name: str) -> Node:
        """The worker holding the label ``name``'s shard (where it is now: shards move)."""
        ports = dict(self.query(self.coordinator, _PORT_OF_KEY, SHARD_KEYS - 1))
        return next(node for node in self.workers if node.port == ports[shard_key(name)])

    def names_on(self, node: Node, prefix: str, count: int) -> list[str]:
        """``count`` label names (``prefix-N``) whose shards are on ``node``."""
        ports = dict(self.query(self.coordinator, _PORT_OF_KEY, SHARD_KEYS - 1))
        names = (f"{prefix}-{n}" for n in range(10_000))
        return [name for name in names if ports[shard_key(name)] == node.port][:count]


def create_cluster_database(name: str, coordinator_at: str | None = None) -> Cluster:
    """``name`` on the coordinator and every worker, with the extension, the workers added.

    The coordinator is ``coordinator_at`` (a URL of any of its databases that lists the
    workers), else ``ROUTEMASTER_TEST_CITUS_URL``'s. Not migrated: the caller runs the
    migrations on :attr:`Cluster.url`, as a user does (or uses :func:`fresh_cluster_database`).
    """
    template = sa.engine.make_url(
        normalise_url(coordinator_at) if coordinator_at else coordinator_url()
    )
    coordinator = Node(template.host or "127.0.0.1", template.port or 5432)
    cluster = Cluster(template, name, coordinator, tuple(worker_nodes(template)))
    if not cluster.workers:
        raise RuntimeError(f"{CITUS_URL}: the coordinator lists no worker nodes (pg_dist_node)")

    def make(node: Node) -> None:
        _query(node.url(template, template.database or "postgres"), f'CREATE DATABASE "{name}"')
        engine = _admin(cluster.node_url(node))
        try:
            with engine.connect() as conn:
                conn.execute(_CREATE_EXTENSION)
        finally:
            engine.dispose()

    try:
        _on_each(cluster.nodes, make)
        engine = _admin(cluster.node_url(coordinator))
        try:
            with engine.connect() as conn:
                conn.execute(_SET_COORDINATOR, {"host": coordinator.host, "port": coordinator.port})
                for worker in cluster.workers:
                    conn.execute(_ADD_NODE, {"host": worker.host, "port": worker.port})
        finally:
            engine.dispose()
    except BaseException:
        drop_cluster_database(cluster)
        raise
    return cluster


def drop_cluster_database(cluster: Cluster) -> None:
    """Drop the database on every node; the coordinator first, so nothing reconnects to the
    workers' copies. A prepared transaction left on a node (a test that stopped mid-commit)
    would keep its database, so those are rolled back first."""
    if "engine" in cluster.__dict__:
        cluster.engine.dispose()

    def drop(node: Node) -> None:
        engine = _admin(cluster.node_url(node))
        try:
            with engine.connect() as conn:
                for (gid,) in conn.execute(_PREPARED_HERE).all():
                    conn.execute(sa.text(f"ROLLBACK PREPARED '{gid}'"))
        except sa.exc.OperationalError:
            pass  # the database is not there (a half-made session): nothing to roll back
        finally:
            engine.dispose()
        _query(
            node.url(cluster.template, cluster.template.database or "postgres"),
            f'DROP DATABASE IF EXISTS "{cluster.name}" WITH (FORCE)',
        )

    drop(cluster.coordinator)
    _on_each(cluster.workers, drop)


@contextlib.contextmanager
def fresh_cluster_database(name: str, coordinator_at: str | None = None) -> Iterator[Cluster]:
    """:func:`create_cluster_database`, migrated (``routemaster migrate`` distributes it);
    dropped on every node afterwards."""
    cluster = create_cluster_database(name, coordinator_at)
    try:
        upgrade(cluster.engine)
        yield cluster
    finally:
        drop_cluster_database(cluster)


def shards_of_labels(engine: sa.Engine) -> int:
    """How many shards ``labels`` has."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_dist_shard"
                    " WHERE logicalrelid = CAST('labels' AS regclass)"
                )
            ).scalar_one()
        )


def shards_holding(engine: sa.Engine, table: str, where: str = "true") -> int:
    """How many shards of ``labels`` hold rows of ``table`` matching ``where`` (test SQL)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(DISTINCT get_shard_id_for_distribution_column('labels',"
                    f" shard_key)) FROM {table} WHERE {where}"
                )
            ).scalar_one()
        )


def names_on_every_shard(engine: sa.Engine, prefix: str, count: int) -> list[str]:
    """``count`` label names ``prefix0``, ``prefix1``...: enough to reach every shard (checked)."""
    with engine.connect() as conn:
        shards = conn.execute(
            sa.text(
                "SELECT count(DISTINCT get_shard_id_for_distribution_column('labels',"
                " routemaster_shard_key(:prefix || i))) FROM generate_series(0, :last) AS i"
            ),
            {"prefix": prefix, "last": count - 1},
        ).scalar_one()
    assert shards == shards_of_labels(engine), "choose more names: some shard has none"
    return [f"{prefix}{i}" for i in range(count)]


@dataclass(frozen=True)
class Server:
    """A PostgreSQL server of the cluster that a test stops and starts (``pg_ctl``, as the
    data directory's owner: ``cluster.sh`` runs the servers as the OS user ``postgres``)."""

    data: Path
    major: int

    @classmethod
    def at(cls, url: sa.URL | str) -> Server:
        """The server answering at ``url``: its data directory and version come from itself."""
        if isinstance(url, sa.URL):
            url = url.render_as_string(hide_password=False)
        engine = _admin(sa.engine.make_url(normalise_url(url)))
        try:
            with engine.connect() as conn:
                data = Path(conn.execute(_DATA_DIRECTORY).scalar_one())
                major = int(conn.execute(_SERVER_VERSION).scalar_one())
        finally:
            engine.dispose()
        return cls(data, major)

    def _pg_ctl(self, *args: str) -> None:
        command = [f"/usr/lib/postgresql/{self.major}/bin/pg_ctl", "-D", str(self.data), *args]
        owner = pwd.getpwuid(self.data.stat().st_uid).pw_name
        if os.geteuid() == 0 and owner != "root":
            command = ["runuser", "-u", owner, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def stop(self) -> None:
        """A fast shutdown: sessions are cut, as when a node goes down."""
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        """Start it again (once it accepts connections), logging beside its data directory."""
        self._pg_ctl("-w", "-l", str(self.data.parent / f"{self.data.name}.log"), "start")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


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
    probe = _connect(cluster.node_url(cluster.coordinator))
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


def refused_connection() -> sa.exc.OperationalError:
    """The error of a connection a node refused (nothing listens on port 1): what a node pool
    reports as not reached (``Nodes.unreachable``)."""
    refused = sa.create_engine("postgresql+psycopg2://root@127.0.0.1:1/x?connect_timeout=1")
    try:
        with pytest.raises(sa.exc.OperationalError) as error:
            refused.connect()
    finally:
        refused.dispose()
    return error.value
