"""Bring a database to the current schema with the alembic migrations shipped in the package.

On a database where the ``citus`` extension is installed, the same migrations
run, and then the tables are distributed (SPEC F1, docs/deployment.md): every
table that grows with labels by ``shard_key``, co-located with ``labels`` (so
a label's rows share a shard), and the small tables that statements join
with those as reference tables (a copy on every node). The other small tables
stay plain tables on the coordinator, where every connection arrives.
Distributing is idempotent: what is distributed already is left alone, so a
second ``migrate`` does nothing.

Migrations after 0017 must work on both: one statement per ``op.execute``
(Citus refuses several commands in one statement on distributed tables); no
primary key or unique index without ``shard_key`` on a distributed table;
no trigger, identity or generated column there; a new per-label table gets
``shard_key`` and joins :data:`DISTRIBUTED_TABLES`. DDL on a distributed table
is propagated to its shards by Citus.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig

from routemaster.db.statements import fetch_all, fetch_one, fetch_value

DISTRIBUTED_TABLES = (
    "labels",
    "history",
    "tasks",
    "deliveries",
    "bulk_items",
    "children",
    "spawns",
    "child_wakes",
)
"""The tables that grow with labels, distributed by ``shard_key``; ``labels`` first."""

REFERENCE_TABLES = ("bulk_jobs", "retention_horizons")
"""Small tables that statements join with distributed ones (``bulk_items`` also has a foreign
key to ``bulk_jobs``): a copy on every node. Before the distributed ones, for that key."""

# Held until the migrating transaction ends: one process migrates at a time.
_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(2017)"

_CITUS_INSTALLED = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
_CITUS_TABLES = "SELECT CAST(logicalrelid AS text) FROM pg_dist_partition"
_CREATE_REFERENCE_TABLE = "SELECT create_reference_table(CAST(%(table)s AS regclass))"
_DISTRIBUTE_LABELS = "SELECT create_distributed_table('labels', 'shard_key')"
_DISTRIBUTE_COLOCATED = """
    SELECT create_distributed_table(CAST(%(table)s AS regclass), 'shard_key',
                                    colocate_with => 'labels')
    """
# Distributing copies a table's rows into its shards and leaves the coordinator's own copy.
_DROP_LOCAL_COPY = (
    "SELECT truncate_local_data_after_distributing_table(CAST(%(table)s AS regclass))"
)


def migrations_dir() -> Path:
    """Where the migrations are: ``routemaster.migrations`` once installed (wheel or editable).

    In a source tree used without installing it (only on ``sys.path``), the
    package is ``migrations/`` beside ``routemaster/``.
    """
    spec = importlib.util.find_spec("routemaster.migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    beside = Path(__file__).resolve().parents[3] / "migrations"
    if (beside / "env.py").is_file():
        return beside
    raise RuntimeError("routemaster's migrations are missing: reinstall the package")


def alembic_config() -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def migrate(engine: sa.Engine, revision: str = "head") -> None:
    """Run ``alembic upgrade`` on ``engine``'s database, then distribute its tables on Citus,
    each serialised by an advisory lock.

    The lock lets several processes (serve and cron started together) migrate
    the same database at start-up without tripping over each other. What the
    store then keeps from the data (the kept label counts) is seeded by
    :func:`routemaster.db.upgrade.upgrade`, which calls this first.
    """
    config = alembic_config()
    with engine.begin() as connection:
        hold_migration_lock(connection)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    distribute(engine)


def hold_migration_lock(connection: sa.Connection) -> None:
    """Hold the migration lock until ``connection``'s transaction ends."""
    fetch_one(connection, _MIGRATION_LOCK)


def labels_distributed(connection: sa.Connection) -> bool:
    """Whether Citus is installed and ``labels`` distributed."""
    return bool(fetch_value(connection, _CITUS_INSTALLED)) and "labels" in {
        row[0] for row in fetch_all(connection, _CITUS_TABLES)
    }


def distribute(engine: sa.Engine) -> list[str]:
    """On Citus, distribute the tables not yet distributed; the tables it distributed.

    Nothing happens on plain PostgreSQL, nor on Citus once every table is
    distributed. One transaction, under the migration lock.
    """
    with engine.begin() as connection:
        hold_migration_lock(connection)
        if not fetch_value(connection, _CITUS_INSTALLED):
            return []
        done = {row[0] for row in fetch_all(connection, _CITUS_TABLES)}
        made: list[str] = []
        for table in REFERENCE_TABLES:
            if table not in done:
                fetch_one(connection, _CREATE_REFERENCE_TABLE, {"table": table})
                made.append(table)
        for table in DISTRIBUTED_TABLES:
            if table not in done:
                statement = _DISTRIBUTE_LABELS if table == "labels" else _DISTRIBUTE_COLOCATED
                fetch_one(connection, statement, {"table": table})
                made.append(table)
        for table in made:
            fetch_one(connection, _DROP_LOCAL_COPY, {"table": table})
        return made
