"""The test session's database on a Citus cluster (SPEC F1): a coordinator and its workers.

``ROUTEMASTER_TEST_CITUS_URL`` set to a coordinator's URL (``../shared/citus/cluster.sh
start`` prints one; ``scripts/test`` starts a cluster and sets it for its Citus pass) makes the
session's database a Citus one: made on the coordinator and on every worker node the
coordinator's database lists in ``pg_dist_node``, the extension created on each, the workers
added, then migrated as ``routemaster migrate`` does (which distributes the tables). Unset,
nothing here runs and the session uses plain PostgreSQL as before.

Tests that only mean something on Citus (a shard move, a worker node restart) carry the
``citus`` marker and are skipped on plain PostgreSQL (tests/conftest.py).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa

from routemaster.db.plumbing.database import normalise_url

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


def citus_run() -> bool:
    """Whether this test session's database is on a Citus cluster."""
    return bool(os.environ.get(CITUS_URL))


def coordinator_url() -> str:
    """The coordinator named by ``ROUTEMASTER_TEST_CITUS_URL``, as SQLAlchemy wants it."""
    return normalise_url(os.environ[CITUS_URL])


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


@dataclass(frozen=True)
class CitusDatabase:
    """A database made on every node of the cluster: the coordinator first, then the workers."""

    template: sa.URL
    name: str
    coordinator: Node
    workers: tuple[Node, ...]

    @property
    def url(self) -> str:
        """The coordinator's URL for this database: what the service is given."""
        return self.coordinator.url(self.template, self.name).render_as_string(hide_password=False)

    def node_url(self, node: Node) -> sa.URL:
        return node.url(self.template, self.name)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.coordinator, *self.workers)


def create_citus_database(name: str, coordinator_at: str | None = None) -> CitusDatabase:
    """``name`` on the coordinator and every worker, with the extension, the workers added.

    The coordinator is ``coordinator_at`` (a URL of any of its databases that lists the
    workers), else ``ROUTEMASTER_TEST_CITUS_URL``'s. Not migrated: the caller runs the
    migrations on :attr:`CitusDatabase.url`, as a user does.
    """
    template = sa.engine.make_url(
        normalise_url(coordinator_at) if coordinator_at else coordinator_url()
    )
    coordinator = Node(template.host or "127.0.0.1", template.port or 5432)
    database = CitusDatabase(template, name, coordinator, tuple(worker_nodes(template)))
    if not database.workers:
        raise RuntimeError(f"{CITUS_URL}: the coordinator lists no worker nodes (pg_dist_node)")

    def make(node: Node) -> None:
        maintenance = _admin(node.url(template, template.database or "postgres"))
        try:
            with maintenance.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            maintenance.dispose()
        engine = _admin(database.node_url(node))
        try:
            with engine.connect() as conn:
                conn.execute(_CREATE_EXTENSION)
        finally:
            engine.dispose()

    try:
        _on_each(database.nodes, make)
        engine = _admin(database.node_url(coordinator))
        try:
            with engine.connect() as conn:
                conn.execute(_SET_COORDINATOR, {"host": coordinator.host, "port": coordinator.port})
                for worker in database.workers:
                    conn.execute(_ADD_NODE, {"host": worker.host, "port": worker.port})
        finally:
            engine.dispose()
    except BaseException:
        drop_citus_database(database)
        raise
    return database


def drop_citus_database(database: CitusDatabase) -> None:
    """Drop the database on every node; the coordinator first, so nothing reconnects to the
    workers' copies. A prepared transaction left on a node (a test that stopped mid-commit)
    would keep its database, so those are rolled back first."""

    def drop(node: Node) -> None:
        engine = _admin(database.node_url(node))
        try:
            with engine.connect() as conn:
                for (gid,) in conn.execute(_PREPARED_HERE).all():
                    conn.execute(sa.text(f"ROLLBACK PREPARED '{gid}'"))
        except sa.exc.OperationalError:
            pass  # the database is not there (a half-made session): nothing to roll back
        finally:
            engine.dispose()
        maintenance = _admin(node.url(database.template, database.template.database or "postgres"))
        try:
            with maintenance.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database.name}" WITH (FORCE)'))
        finally:
            maintenance.dispose()

    drop(database.coordinator)
    _on_each(database.workers, drop)


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
