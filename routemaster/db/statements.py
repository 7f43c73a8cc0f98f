"""Running the service's hottest statements on the driver's cursor, and one-statement transactions.

Every API request runs one to three statements. Through SQLAlchemy's
``Connection.execute`` each costs an execution context and a result object
whose column metadata is rebuilt from the cursor every time (a textual
statement has no cached result map): about two thirds of a label read's
Python time in the profile (docs/performance.md). These helpers hand the
SQL and its parameters straight to the psycopg2 cursor of the same pooled
connection, inside the same transaction, and return plain tuples.

When anything listens to the engine's execution events (an APM's or a
test's ``before_cursor_execute``), the statements go through SQLAlchemy as
before, so the listeners see every one.

Failures still go through SQLAlchemy's handling (``_handle_dbapi_exception``,
the one thing ``Connection.execute`` would have done with them): the
caller sees the same ``sqlalchemy.exc`` classes, parameters stay hidden as
the engine says, and a connection the server dropped invalidates the pool.

:func:`single_statement` is for work that is one statement: it runs in
autocommit, so PostgreSQL makes that statement its own transaction and the
separate ``BEGIN`` and ``COMMIT``/``ROLLBACK`` round trips disappear.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import sqlalchemy as sa

Params = Mapping[str, Any]


def fetch_one(conn: sa.Connection, sql: str, params: Params) -> tuple[Any, ...] | None:
    """The first row of ``sql`` (psycopg2 ``%(name)s`` parameters), or ``None``."""
    if conn._has_events or conn.engine._has_events:
        return cast(tuple[Any, ...] | None, conn.exec_driver_sql(sql, params).first())
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
    except Exception as error:
        conn._handle_dbapi_exception(error, sql, params, cursor, None)
    cursor.close()
    return row


def fetch_all(conn: sa.Connection, sql: str, params: Params) -> list[tuple[Any, ...]]:
    """Every row of ``sql``."""
    if conn._has_events or conn.engine._has_events:
        return cast(list[tuple[Any, ...]], conn.exec_driver_sql(sql, params).all())
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, params)
        rows = cast(list[tuple[Any, ...]], cursor.fetchall())
    except Exception as error:
        conn._handle_dbapi_exception(error, sql, params, cursor, None)
    cursor.close()
    return rows


def run(conn: sa.Connection, sql: str, params: Params | None = None) -> None:
    """Execute ``sql`` for its effect."""
    if conn._has_events or conn.engine._has_events:
        conn.exec_driver_sql(sql, params)
        return
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, params)
    except Exception as error:
        conn._handle_dbapi_exception(error, sql, params, cursor, None)
    cursor.close()


@contextmanager
def single_statement(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A pooled connection in autocommit, for exactly one statement (which commits itself).

    Use it only where the work is one statement: a second one would commit
    separately. The connection goes back to the pool in its usual mode.
    """
    with engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        dbapi.autocommit = True  # type: ignore[union-attr]
        try:
            yield conn
        finally:
            if not conn.invalidated and not dbapi.closed:  # type: ignore[union-attr]
                dbapi.autocommit = False  # type: ignore[union-attr]
