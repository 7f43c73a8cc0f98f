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

A :class:`Prepared` statement run in autocommit is prepared once per
connection (``PREPARE``, sent in the same round trip as its first
``EXECUTE``), so PostgreSQL parses and plans it once instead of on every
request: for a create that was about a fifth of the server's CPU
(docs/performance.md). Behind a pooler that does not keep a client on one
server connection (PgBouncer in transaction mode), the server answers that
the statement does not exist, or already does; nothing has run then, so the
statement is run as plain SQL instead, and that connection stays on plain
SQL from then on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import sqlalchemy as sa

Params = Mapping[str, Any]

_PARAMETER = re.compile(r"%\((\w+)\)s")
_PREPARED_KEY = "routemaster.prepared"  # in the pool's per-connection info: names prepared there
# What the server says when a prepared statement is missing or already there: a pooler between.
_POOLER_CODES = frozenset({"26000", "42P05"})  # invalid_sql_statement_name, duplicate_pstatement


@dataclass(frozen=True)
class Prepared:
    """A hot statement (psycopg2 ``%(name)s`` parameters) to prepare once per connection."""

    name: str
    sql: str
    execute: str = field(init=False, repr=False)
    prepare_and_execute: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        order: list[str] = []

        def numbered(match: re.Match[str]) -> str:
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        # Literal %% stays escaped: both texts are formatted by psycopg2 with the parameters.
        body = _PARAMETER.sub(numbered, self.sql)
        execute = f"EXECUTE {self.name} ({', '.join(f'%({name})s' for name in order)})"
        object.__setattr__(self, "execute", execute)
        object.__setattr__(self, "prepare_and_execute", f"PREPARE {self.name} AS {body}; {execute}")


def _text_for(conn: sa.Connection, dbapi: Any, statement: str | Prepared) -> str:
    """What to send for ``statement`` on this connection now."""
    if isinstance(statement, str):
        return statement
    info = conn.connection.info
    prepared: set[str] | None = info.setdefault(_PREPARED_KEY, set())
    if prepared is None or not dbapi.autocommit:
        # In a transaction a failed EXECUTE would abort it: prepared only in autocommit.
        return statement.sql
    if statement.name in prepared:
        return statement.execute
    prepared.add(statement.name)
    return statement.prepare_and_execute


def fetch_one(conn: sa.Connection, sql: str | Prepared, params: Params) -> tuple[Any, ...] | None:
    """The first row of ``sql`` (psycopg2 ``%(name)s`` parameters), or ``None``."""
    plain = sql if isinstance(sql, str) else sql.sql
    if conn._has_events or conn.engine._has_events:
        return cast(tuple[Any, ...] | None, conn.exec_driver_sql(plain, params).first())
    dbapi = conn.connection.dbapi_connection
    cursor = dbapi.cursor()  # type: ignore[union-attr]
    text = _text_for(conn, dbapi, sql)
    try:
        try:
            cursor.execute(text, params)
        except Exception as error:
            if text == plain or getattr(error, "pgcode", None) not in _POOLER_CODES:
                raise
            conn.connection.info[_PREPARED_KEY] = None  # plain SQL on this connection from now on
            cursor.execute(plain, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
    except Exception as error:
        conn._handle_dbapi_exception(error, plain, params, cursor, None)
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
