"""Alembic environment: the URL comes from the connection handed in, or the environment."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from routemaster.db.plumbing.database import DatabaseURLError, url_from_environment
from routemaster.db.schema import metadata

target_metadata = metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    try:
        url = context.config.get_main_option("sqlalchemy.url") or url_from_environment()
    except DatabaseURLError as error:
        raise SystemExit(str(error)) from None
    if not url:
        raise SystemExit("No database: set DATABASE_URL (or DB_HOST, DB_NAME, DB_USER, ...)")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("Offline migrations are not supported; run against a database.")
run_migrations()
