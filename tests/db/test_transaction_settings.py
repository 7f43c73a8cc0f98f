"""What each transaction sends in front of its statements: the timeout always, the versions only
where history is written (issue 36: a read stamps no version and costs what it did).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.app import utc_now
from routemaster.db import labels as store
from routemaster.db import transitions
from routemaster.db.history import stamp_versions
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import fetch_value, single_statement

_VERSION_OF_LAST = "SELECT version FROM history ORDER BY id DESC LIMIT 1"
_TIMEOUT = "SHOW statement_timeout"


@pytest.fixture
def engine(database_url: str, db_engine: sa.Engine) -> Iterator[sa.Engine]:
    """An engine with a 5 s timeout and versions to stamp, whose statements are recorded."""
    engine = create_engine(database_url, statement_timeout=5)
    stamp_versions(engine, {"flow": 7})
    yield engine
    engine.dispose()


def _sent(engine: sa.Engine) -> list[str]:
    sent: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    return sent


def test_a_read_carries_the_timeout_and_no_versions(engine: sa.Engine) -> None:
    sent = _sent(engine)
    with single_statement(engine) as conn:
        assert store.get(conn, "flow", "nobody") is None
    assert sent[0].startswith("SET LOCAL statement_timeout = %(routemaster_statement_timeout)s;")
    assert "routemaster.versions" not in sent[0]
    with engine.begin() as conn:
        assert fetch_value(conn, _TIMEOUT) == "5s"  # the transaction's first statement
        assert fetch_value(conn, _TIMEOUT) == "5s"  # and for the rest of it
    assert not any("routemaster.versions" in statement for statement in sent)


def test_history_written_after_a_read_in_its_transaction_carries_its_version(
    engine: sa.Engine,
) -> None:
    now = utc_now()
    with single_statement(engine) as conn:
        created = transitions.insert(conn, "flow", "a", {}, state="start", now=now, due=False)
    assert created is not None
    sent = _sent(engine)
    with engine.begin() as conn:
        label = store.get(conn, "flow", "a")  # the first statement: a read, no versions
        assert label is not None
        assert transitions.soft_delete(conn, "flow", "a", now=now) == "start"  # writes history
        assert fetch_value(conn, _VERSION_OF_LAST) == 7
    # The versions are parameters of the statement that writes history (migration 0017), never
    # a setting of the transaction.
    assert not any("routemaster.versions" in statement for statement in sent)
