"""A benchmark's own database, created on the server ``DATABASE_URL`` names and dropped after.

    scratch = ScratchDatabase(f"bench_drain_{os.getpid()}")
    try:
        ...  # scratch.url
    finally:
        scratch.drop()

``DATABASE_URL`` defaults to ``postgresql://postgres@127.0.0.1:5432/postgres``;
the server must let that user create databases.
"""

from __future__ import annotations

import os

import sqlalchemy as sa

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def server_url() -> sa.URL:
    """The server's URL (psycopg2), from ``DATABASE_URL`` or the default."""
    raw = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    return sa.engine.make_url(raw).set(drivername="postgresql+psycopg2")


class ScratchDatabase:
    """Creates the database ``name`` at once; :meth:`drop` removes it, connections and all."""

    def __init__(self, name: str) -> None:
        self.name = name
        server = server_url()
        self._admin = sa.create_engine(
            server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
        )
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        self.url = server.set(database=name).render_as_string(hide_password=False)

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()
