"""Bring a database to the current schema with the alembic migrations shipped in the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig

from routemaster.db.statements import fetch_one

# Held until the migrating transaction ends: one process migrates at a time.
_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(2017)"


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


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Run ``alembic upgrade`` on ``engine``'s database, serialised by an advisory lock.

    The lock lets several processes (serve and cron started together) migrate
    the same database at start-up without tripping over each other.
    """
    config = alembic_config()
    with engine.begin() as connection:
        fetch_one(connection, _MIGRATION_LOCK)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
