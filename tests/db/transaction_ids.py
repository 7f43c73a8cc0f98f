"""Transaction ids for tests that write history at chosen positions."""

from __future__ import annotations

import sqlalchemy as sa


def past_transaction(engine: sa.Engine, xact: int) -> None:
    """Take transaction ids until ``xact`` is in the past: history written at positions up to
    it is then below the stream's horizon (a fresh server's or cluster's ids are in the
    hundreds)."""
    while True:
        with engine.begin() as conn:
            now = conn.exec_driver_sql("SELECT CAST(pg_current_xact_id() AS text)").scalar_one()
            if int(now) > xact:
                return
