"""One process at a time, by a lease row, whatever ``DATABASE_URL`` names (SPEC F3): the same
mechanism directly on PostgreSQL and through a transaction-mode pooler."""

from __future__ import annotations

import sqlalchemy as sa

from routemaster.db.config_migrations import CONFIG_LEASE, config_lock

_HELD = sa.text("SELECT name FROM leases")


def _held(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(_HELD).scalars())


def test_the_configuration_lock_is_a_lease_row_that_a_second_holder_cannot_take(
    db_engine: sa.Engine,
) -> None:
    with config_lock(db_engine, wait=True) as held:
        assert held
        assert _held(db_engine) == [CONFIG_LEASE]
        with config_lock(db_engine, wait=False) as second:
            assert not second
    assert _held(db_engine) == []
    with config_lock(db_engine, wait=False) as again:
        assert again
