"""The pool survives a database that dropped its connections while they sat idle."""

from __future__ import annotations

import sqlalchemy as sa

from routemaster.db.plumbing.database import create_engine


def _terminate_other_backends(database_url: str) -> int:
    admin = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        killed = conn.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    admin.dispose()
    return int(killed)


def test_an_idle_connection_killed_by_the_server_is_replaced_unseen(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=1, idle_ping_after=0)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    assert _terminate_other_backends(database_url) >= 1  # as a server restart would
    with engine.connect() as conn:  # no error reaches the caller
        assert conn.execute(sa.text("SELECT 2")).scalar_one() == 2
    engine.dispose()
