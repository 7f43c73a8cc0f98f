"""A fresh database on a Citus cluster for one test session, migrated and distributed.

``ROUTEMASTER_TEST_CITUS_URL`` names a database on the cluster's coordinator
(``../shared/citus/cluster.sh start`` prints one); tests that need Citus skip
without it. The session's own database is made on the coordinator and on every
worker node (Citus needs the extension in each), joined into a cluster as
``cluster.sh`` does, migrated by ``routemaster migrate``'s own ``upgrade``
(which distributes), and dropped on every node afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from routemaster.db.plumbing.database import create_engine, normalise_url
from routemaster.db.plumbing.migrate import upgrade

CITUS_URL_VARIABLE = "ROUTEMASTER_TEST_CITUS_URL"


def citus_server_url() -> sa.URL:
    url = os.environ.get(CITUS_URL_VARIABLE)
    if not url:
        pytest.skip(f"{CITUS_URL_VARIABLE} names no Citus coordinator")
    return sa.engine.make_url(normalise_url(url))


def _admin(url: sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


@contextmanager
def fresh_citus_database() -> Iterator[str]:
    """A new database on every node of the cluster, migrated; its coordinator URL."""
    coordinator = citus_server_url()
    name = f"routemaster_citus_{uuid.uuid4().hex[:10]}"
    admin = _admin(coordinator)
    with admin.connect() as conn:
        workers = [
            (str(host), int(port))
            for host, port in conn.execute(
                sa.text(
                    "SELECT nodename, nodeport FROM pg_dist_node WHERE noderole = 'primary'"
                    " AND groupid <> 0"
                )
            )
        ]
    nodes = [coordinator] + [coordinator.set(host=host, port=port) for host, port in workers]
    for node in nodes:
        with _admin(node.set(database="postgres")).connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        with _admin(node.set(database=name)).connect() as conn:
            conn.execute(sa.text("CREATE EXTENSION citus"))
    with _admin(coordinator.set(database=name)).connect() as conn:
        conn.execute(
            sa.text("SELECT citus_set_coordinator_host(:host, :port)"),
            {"host": coordinator.host, "port": coordinator.port or 5432},
        )
        for host, port in workers:
            conn.execute(
                sa.text("SELECT citus_add_node(:host, :port)"), {"host": host, "port": port}
            )
    url = coordinator.set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    try:
        yield url
    finally:
        for node in reversed(nodes):
            with _admin(node.set(database="postgres")).connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
