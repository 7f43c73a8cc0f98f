"""Statements on the driver's cursor keep SQLAlchemy's errors and its transactions;
prepared ones answer as their plain SQL does, whatever the server forgot."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import (
    Prepared,
    fetch_all,
    fetch_one,
    fetch_value,
    run,
    single_statement,
)

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


def test_error_and_after_execution_listeners_are_called_too(db_engine: sa.Engine) -> None:
    seen: list[str] = []

    def after(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append("after " + statement)

    def failed(context: sa.engine.ExceptionContext) -> None:
        seen.append(f"failed {context.statement}")

    sa.event.listen(db_engine, "after_cursor_execute", after)
    sa.event.listen(db_engine, "handle_error", failed)
    try:
        with single_statement(db_engine) as conn:
            fetch_one(conn, "SELECT 1")
        sa.event.remove(db_engine, "after_cursor_execute", after)
        with pytest.raises(sa.exc.DataError), single_statement(db_engine) as conn:
            fetch_one(conn, "SELECT CAST(%(x)s AS integer)", {"x": "not a number"})
    finally:
        sa.event.remove(db_engine, "handle_error", failed)
    assert seen == ["after SELECT 1", "failed SELECT CAST(%(x)s AS integer)"]


# -- prepared statements ---------------------------------------------------------

SELECT = Prepared(
    "routemaster_test_select",
    "SELECT trigger_key, %(tag)s FROM trigger_occurrences WHERE trigger_key = %(key)s "
    "AND trigger_key LIKE '%%' AND %(tag)s = %(tag)s",
)


def _prepared_here(conn: sa.Connection) -> set[str]:
    """The statements prepared on this pooled connection, as the server knows them."""
    rows = conn.exec_driver_sql("SELECT name FROM pg_prepared_statements").all()
    return {row[0] for row in rows}


def test_a_prepared_statement_answers_as_its_plain_sql_does(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        run(conn, INSERT + ROW, {"key": "a"})
    for _ in range(3):  # prepared with the first, executed by the next ones
        with single_statement(db_engine) as conn:
            assert fetch_one(conn, SELECT, {"key": "a", "tag": "t"}) == ("a", "t")
            assert fetch_one(conn, SELECT, {"key": "b", "tag": "t"}) is None
            assert _prepared_here(conn) == {"routemaster_test_select"}


def test_statements_in_a_transaction_are_never_prepared(db_engine: sa.Engine) -> None:
    # A failed EXECUTE would abort the transaction: only autocommit statements are prepared.
    with db_engine.begin() as conn:
        run(conn, INSERT + ROW, {"key": "a"})
        assert fetch_one(conn, SELECT, {"key": "a", "tag": "t"}) == ("a", "t")
        assert _prepared_here(conn) == set()


@pytest.mark.parametrize(
    "interference",
    [
        "DEALLOCATE routemaster_test_select",  # the server lost it (a pooler moved us)
        "DEALLOCATE ALL; PREPARE routemaster_test_select AS SELECT 1",  # another client's
    ],
)
def test_a_statement_the_server_lost_or_holds_already_runs_as_plain_sql(
    database_url: str, interference: str
) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    with engine.begin() as conn:
        run(conn, "DELETE FROM trigger_occurrences")
        run(conn, INSERT + ROW, {"key": "a"})
    with single_statement(engine) as conn:
        assert fetch_one(conn, SELECT, {"key": "a", "tag": "t"}) == ("a", "t")
    with engine.connect() as conn:  # the same server connection, behind the pool's back
        if "ALL" in interference:
            conn.connection.info.clear()  # as if this connection had never prepared it
        conn.exec_driver_sql(interference)
        conn.commit()
    with single_statement(engine) as conn:
        assert fetch_one(conn, SELECT, {"key": "a", "tag": "t"}) == ("a", "t")
    with single_statement(engine) as conn:  # and from then on, plain SQL on that connection
        assert fetch_one(conn, SELECT, {"key": "a", "tag": "u"}) == ("a", "u")
        assert "routemaster_test_select" not in _prepared_here(conn) or "ALL" in interference
    engine.dispose()


def test_errors_of_a_prepared_statement_are_sqlalchemys(db_engine: sa.Engine) -> None:
    failing = Prepared("routemaster_test_cast", "SELECT CAST(%(x)s AS integer)")
    for _ in range(2):  # when preparing, and when executing what was prepared
        with pytest.raises(sa.exc.DataError), single_statement(db_engine) as conn:
            fetch_one(conn, failing, {"x": "not a number"})
    with single_statement(db_engine) as conn:
        assert fetch_one(conn, failing, {"x": "7"}) == (7,)


def test_a_server_that_dropped_its_connections_costs_one_failure_not_one_per_connection(
    database_url: str,
) -> None:
    # Idle connections are not pinged here, so only the pool's invalidation saves the others.
    engine = create_engine(database_url, pool_size=3, max_overflow=0, idle_ping_after=3600)
    admin = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    with engine.connect() as first, engine.connect() as second:  # two idle ones in the pool
        pids = [fetch_value(first, "SELECT pg_backend_pid()")]
        pids.append(fetch_value(second, "SELECT pg_backend_pid()"))
    with pytest.raises(sa.exc.OperationalError) as failure, engine.connect() as conn:
        pids.append(fetch_value(conn, "SELECT pg_backend_pid()"))
        with single_statement(admin) as other:  # as a server restart would, mid-use
            run(
                other,
                "SELECT pg_terminate_backend(pid) FROM unnest(%(pids)s) AS pid",
                {"pids": pids},
            )
        fetch_one(conn, "SELECT 1")
    assert failure.value.connection_invalidated
    admin.dispose()
    for _ in range(3):  # every later request gets a live connection
        with single_statement(engine) as conn:
            assert fetch_one(conn, "SELECT 2") == (2,)
    engine.dispose()


def test_an_errors_parameters_are_hidden_whatever_the_engine_says(database_url: str) -> None:
    engine = sa.create_engine(database_url)  # SQLAlchemy's default would show them
    with pytest.raises(sa.exc.DataError) as failure, engine.connect() as conn:
        fetch_one(conn, "SELECT CAST(%(x)s AS integer)", {"x": "1.5"})
    assert failure.value.hide_parameters  # (the server's own message may quote the statement)
    engine.dispose()
