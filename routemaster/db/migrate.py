"""Bring a database to the current schema with the repository's alembic migrations."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


def alembic_config() -> AlembicConfig:
    ini = REPOSITORY_ROOT / "alembic.ini"
    config = AlembicConfig(str(ini))
    config.set_main_option("script_location", str(REPOSITORY_ROOT / "migrations"))
    return config


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Run ``alembic upgrade`` on ``engine``'s database, serialised by an advisory lock.

    The lock lets several processes (serve and cron started together) migrate
    the same database at start-up without tripping over each other.
    """
    config = alembic_config()
    with engine.begin() as connection:
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(2017)"))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
