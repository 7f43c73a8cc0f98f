"""Statements on the driver's cursor keep SQLAlchemy's errors and its transactions."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from routemaster.db.database import create_engine
from routemaster.db.statements import fetch_all, fetch_one, run, single_statement

INSERT = "INSERT INTO trigger_occurrences (trigger_key, occurrence) VALUES "
ROW = "(%(key)s, '2026-11-23T12:00:00Z')"


def _machines(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        rows = fetch_all(conn, "SELECT trigger_key FROM trigger_occurrences ORDER BY 1", {})
    return [row[0] for row in rows]


def test_a_transaction_commits_every_statement_together(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        run(conn, INSERT + ROW, {"key": "a"})
        run(conn, INSERT + ROW, {"key": "b"})
        assert fetch_one(conn, "SELECT count(*) FROM trigger_occurrences", {}) == (2,)
    assert _machines(db_engine) == ["a", "b"]


def test_a_transaction_that_raises_leaves_nothing(db_engine: sa.Engine) -> None:
    with pytest.raises(ZeroDivisionError), db_engine.begin() as conn:
        run(conn, INSERT + ROW, {"key": "a"})
        _ = 1 / 0
    assert _machines(db_engine) == []


def test_a_failing_statement_is_sqlalchemys_error_and_undoes_the_transaction(
    db_engine: sa.Engine,
) -> None:
    with pytest.raises(sa.exc.IntegrityError), db_engine.begin() as conn:
        run(conn, INSERT + ROW, {"key": "a"})
        run(conn, INSERT + ROW, {"key": "a"})  # the same key twice
    assert _machines(db_engine) == []
    with db_engine.begin() as conn:  # the pooled connection is fine afterwards
        run(conn, INSERT + ROW, {"key": "c"})
    assert _machines(db_engine) == ["c"]


def test_a_failing_first_statement_is_refused_before_anything_is_written(
    db_engine: sa.Engine,
) -> None:
    with pytest.raises(sa.exc.ProgrammingError), db_engine.begin() as conn:
        run(conn, "SELECT no_such_column FROM trigger_occurrences")
    with pytest.raises(sa.exc.DataError), single_statement(db_engine) as conn:
        fetch_one(conn, "SELECT CAST(%(x)s AS integer)", {"x": "not a number"})
    assert _machines(db_engine) == []


def test_connections_go_back_to_the_pool_in_their_usual_mode(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    with single_statement(engine) as conn:
        fetch_one(conn, "SELECT 1", {})
    with pytest.raises(ZeroDivisionError), engine.begin() as conn:  # the same connection
        conn.execute(sa.text(INSERT + "('x', now())"))
        _ = 1 / 0
    assert _machines(engine) == []
    engine.dispose()


def test_listeners_of_sqlalchemys_execution_events_still_see_every_statement(
    db_engine: sa.Engine,
) -> None:
    with db_engine.begin() as conn:
        run(conn, INSERT + ROW, {"key": "a"})
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    sa.event.listen(db_engine, "before_cursor_execute", record)
    try:
        with single_statement(db_engine) as conn:
            row = fetch_one(conn, "SELECT trigger_key FROM trigger_occurrences", {})
        with db_engine.begin() as conn:
            run(conn, INSERT + ROW, {"key": "b"})
            rows = fetch_all(conn, "SELECT trigger_key FROM trigger_occurrences ORDER BY 1", {})
    finally:
        sa.event.remove(db_engine, "before_cursor_execute", record)
    assert tuple(row or ()) == ("a",)
    assert [tuple(r) for r in rows] == [("a",), ("b",)]
    assert [statement.split()[0] for statement in seen] == ["SELECT", "INSERT", "SELECT"]
    assert _machines(db_engine) == ["a", "b"]
