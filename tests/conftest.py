"""Shared fixtures: a real PostgreSQL database, migrated, emptied between tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from routemaster.db.nodes import dispose_nodes
from routemaster.db.plumbing.database import create_engine, normalise_url
from routemaster.db.upgrade import upgrade
from tests.citus_cluster import Cluster, citus_run, fresh_cluster_database
from tests.pooler import pooled_run, running_pgbouncer
from tests.stub_server import StubServer, running_stub


def _server_url() -> str:
    """The server tests run against: as README says, in this order of preference."""
    for variable in ("TEST_DATABASE_URL", "DATABASE_URL"):
        if os.environ.get(variable):
            return normalise_url(os.environ[variable])
    local = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
    try:
        probe = sa.create_engine(
            local, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 2}
        )
        with probe.connect():
            pass
        return local
    except sa.exc.OperationalError:
        from routemaster.db.plumbing.embedded import embedded_database_url

        return embedded_database_url()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``citus`` (a shard move, a worker node restart) need a Citus cluster
    (``ROUTEMASTER_TEST_CITUS_URL``, tests/citus_cluster.py): skipped on plain PostgreSQL."""
    if citus_run():
        return
    skip = pytest.mark.skip(reason="needs a Citus cluster (ROUTEMASTER_TEST_CITUS_URL)")
    for item in items:
        if item.get_closest_marker("citus"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def session_citus_cluster() -> Iterator[Cluster | None]:
    """The session's database on the Citus cluster ``ROUTEMASTER_TEST_CITUS_URL`` names, made
    on the coordinator and every worker node and migrated through the coordinator (which
    distributes the tables); ``None`` in a run on plain PostgreSQL."""
    if not citus_run():
        yield None
        return
    with fresh_cluster_database(f"routemaster_test_{uuid.uuid4().hex[:10]}") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def direct_database_url(session_citus_cluster: Cluster | None) -> Iterator[str]:
    """A fresh database for this test session, migrated to head, dropped afterwards: on the
    Citus cluster in a Citus run (:func:`session_citus_cluster`)."""
    if session_citus_cluster is not None:
        yield session_citus_cluster.url
        return
    server = sa.engine.make_url(_server_url())
    name = f"routemaster_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def database_url(direct_database_url: str) -> Iterator[str]:
    """The URL the service is given (``DATABASE_URL``): the database itself, or, in a pooled
    run (``ROUTEMASTER_TEST_POOLER=1``), PgBouncer in transaction mode in front of it."""
    if not pooled_run():
        yield direct_database_url
        return
    with running_pgbouncer(direct_database_url, pool_size=10) as url:
        yield url


_EMPTY_TABLES = sa.text(
    "TRUNCATE labels, history, trigger_occurrences, api_tokens, machine_versions, tasks,"
    " bulk_items, bulk_jobs, deliveries, receivers, receiver_slots, subscriptions,"
    " retention_horizons, retention_progress, leases, label_counts, flows, flow_keys,"
    " children, spawns, child_wakes"
    " RESTART IDENTITY"
)


@pytest.fixture
def db_engine(database_url: str) -> Iterator[sa.Engine]:
    """An engine on the test database, with every table emptied before the test and after it.

    After it too: ``serve`` and ``cron`` refuse to start while labels sit in
    states their configuration lacks, so no test may leave labels behind for
    a later test's processes (which may run another configuration).
    """
    engine = create_engine(database_url)
    _empty_tables(engine)
    yield engine
    _empty_tables(engine)
    dispose_nodes(engine)
    engine.dispose()


@pytest.fixture
def citus_cluster(session_citus_cluster: Cluster | None, db_engine: sa.Engine) -> Cluster:
    """The session's database on the Citus cluster, its tables emptied before the test and
    after it, with the cluster's helpers (tests/citus_cluster.py); skipped on plain PostgreSQL."""
    if session_citus_cluster is None:
        pytest.skip("needs a Citus cluster (ROUTEMASTER_TEST_CITUS_URL)")
    return session_citus_cluster


def _empty_tables(engine: sa.Engine) -> None:
    """``TRUNCATE`` every table, again if it deadlocked with a thread of the test still ending.

    A changes stream's reader thread may still be in its last read when the test is over; its
    transaction and the ``TRUNCATE`` take their locks in different orders, and PostgreSQL's
    deadlock detector cancels one of them. The reader retries on its own; so does this.
    """
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                conn.execute(_EMPTY_TABLES)
            return
        except sa.exc.OperationalError as error:
            if getattr(error.orig, "pgcode", None) != "40P01" or attempt == 4:
                raise


@pytest.fixture
def direct_engine(db_engine: sa.Engine) -> sa.Engine | None:
    """``App.direct`` for the session's kind of run: the database itself (``LISTEN``), or
    ``None`` in a pooled run, where the listeners' check fails and wake-ups are polled."""
    return None if pooled_run() else db_engine


@pytest.fixture
def stub() -> Iterator[StubServer]:
    """A real HTTP server on 127.0.0.1 that records requests and answers as scripted."""
    yield from running_stub()
