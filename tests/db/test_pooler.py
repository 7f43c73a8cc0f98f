"""Prepared statements behind PgBouncer in transaction mode, where each transaction
may run on another server connection: every create and read still answers right.

Runs a real PgBouncer (tests/pooler.py); skipped where it is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from routemaster.app import utc_now
from routemaster.db import labels as store
from routemaster.db import transitions
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import single_statement
from tests.pooler import running_pgbouncer


@pytest.fixture
def pooled_url(direct_database_url: str) -> Iterator[str]:
    """The test database through PgBouncer: transaction mode, two server connections."""
    with running_pgbouncer(direct_database_url, pool_size=2) as url:
        yield url


def test_creates_and_reads_answer_right_behind_a_transaction_pooler(
    db_engine: sa.Engine, pooled_url: str
) -> None:
    # Four client connections share two server connections: a statement prepared on one
    # is executed where it does not exist, or prepared where another client's already is.
    engine = create_engine(pooled_url, pool_size=4, max_overflow=0)

    def work(client: int) -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        for i in range(40):
            name = f"c{client}-{i}"
            with single_statement(engine) as conn:
                created = transitions.insert(
                    conn, "flow", name, {"i": i}, state="start", now=utc_now(), due=False
                )
            assert created is not None and created.name == name
            with single_statement(engine) as conn:
                read = store.get(conn, "flow", name)
            assert read is not None
            seen.append((read.name, read.metadata["i"]))
            with engine.begin() as conn:  # a transaction's statements, behind the same pooler
                merged = transitions.merge_metadata(
                    conn, "flow", name, {"seen": True}, now=utc_now()
                )
            assert merged is not None and merged.metadata == {"i": i, "seen": True}
        return seen

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    engine.dispose()
    assert results == [[(f"c{c}-{i}", i) for i in range(40)] for c in range(4)]
    with db_engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT count(*) FROM labels WHERE state = 'start'"))
        assert stored.scalar() == 160
