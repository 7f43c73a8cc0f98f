"""How every statement of the service is written and run.

**Written** as a module-level constant holding the complete SQL, with the
driver's named parameters (``%(name)s``; a literal ``%`` is written ``%%``),
in the module of the rows it reads or writes, one constant per operation.
What many statements say alike (a label's columns, the claimable predicate)
is a named piece of :mod:`routemaster.db.catalogue`, put in at import time;
a variant is a flag inside the one statement when the plan is the same, or
derived from its base by one named rule when it is not, never a hand copy
(the catalogue says how; ``tests/db/test_catalogue.py`` prints each whole).
Nothing is assembled at run time but a search's condition, compiled at
request time (:mod:`routemaster.db.search` says how its templates keep one
slot for it). A statement that returns labels lists their columns in
:data:`~routemaster.db.catalogue.LABEL_COLUMNS` order (``tests/db`` checks).

**Run** by :func:`fetch_one`, :func:`fetch_all`, :func:`fetch_value` or
:func:`run` on a pooled ``sqlalchemy.Connection``, inside whatever
transaction the caller opened (or in autocommit: :func:`single_statement`).

Every API request runs one to three statements. Through SQLAlchemy's
``Connection.exec_driver_sql`` each costs an execution context and a result
object whose column metadata is rebuilt from the cursor every time (a
textual statement has no cached result map): a quarter of a label read's
CPU (docs/performance.md). So the runner hands the SQL and its parameters
to a cursor of the same pooled connection's driver connection
(``Connection.connection.driver_connection``) and returns plain tuples.
Only public SQLAlchemy API is used:

- a driver failure becomes the ``sqlalchemy.exc`` exception
  ``exec_driver_sql`` would raise (``DBAPIError.instance``, parameters
  always hidden: they are label metadata). A failure the dialect calls a
  disconnect (``Dialect.is_disconnect``) invalidates the connection
  (``Connection.invalidate``) and empties the engine's pool
  (``Engine.dispose``), as SQLAlchemy does, so the next checkout connects
  afresh; any other failure outside a transaction SQLAlchemy began is
  rolled back, as ``exec_driver_sql`` would;
- when anything listens to the connection's execution events (an APM's or
  a test's ``before_cursor_execute``, a ``handle_error`` hook), statements
  go through ``exec_driver_sql`` instead, so the listeners see every one.
  Whether anything listens is read from the event collections SQLAlchemy
  keeps on ``Engine.dispatch`` and ``Dialect.dispatch`` (:func:`_observed`:
  not underscore-named, but not in SQLAlchemy's reference either; the one
  such use, and tests/db/test_statements.py fails if it ever stops noticing
  a listener, at both ends of the supported range).

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

import contextlib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NoReturn, cast

import sqlalchemy as sa

Params = Mapping[str, Any]
Row = tuple[Any, ...]

NO_PARAMS: Params = MappingProxyType({})
"""Parameters of a statement that has none (``%%`` still means ``%`` in it)."""

_IDLE = 0  # psycopg2's TRANSACTION_STATUS_IDLE: no transaction begun on the connection
_PARAMETER = re.compile(r"%\((\w+)\)s")
_PREPARED_KEY = "routemaster.prepared"  # in the pool's per-connection info: names prepared there
# What the server says when a prepared statement is missing or already there: a pooler between.
_POOLER_CODES = frozenset({"26000", "42P05"})  # invalid_sql_statement_name, duplicate_pstatement
# The connection events that see a statement run through SQLAlchemy.
_EXECUTION_EVENTS = (
    "before_execute",
    "after_execute",
    "before_cursor_execute",
    "after_cursor_execute",
)

_Want = Literal["one", "all", "count"]

SETTINGS_OPTION = "routemaster_transaction_settings"
"""The engine execution option holding its per-transaction settings (``TransactionSettings``)."""

XACT_OPTION = "routemaster_routed_xact"
"""On a connection to a Citus node running a routed write
(:func:`routemaster.db.nodes.writing_near`): what gives its history rows the coordinator's
transaction id, an object whose ``prefix(sql)`` says what to send in front of ``sql``, with
its parameters (``None``: nothing)."""

COORDINATOR_OPTION = "routemaster_coordinator"
"""On a connection to a Citus node running a routed write: the coordinator's connection, where
the write's ``NOTIFY`` goes (:func:`coordinator_of`)."""

_SINGLE_KEY = "routemaster.single_statement"  # in the pool's connection info: in single_statement

PROLOGUE = "SET LOCAL statement_timeout = %(routemaster_statement_timeout)s; "
"""Sent in front of the first statement of every transaction (see
:mod:`routemaster.db.transaction_settings`): a utility statement, no row to answer, so a read
costs the serving process about as much as with no prologue at all."""

_ONE_CONNECTION_PER_WORKER = "SET LOCAL citus.max_adaptive_executor_pool_size = 1; "

CITUS_PROLOGUE = PROLOGUE + _ONE_CONNECTION_PER_WORKER
""":data:`PROLOGUE` on Citus: a statement across the shards goes over one connection per
worker, the one the coordinator's session keeps between transactions. Left to itself Citus
opens more connections for it (up to 16 per worker) and closes all but one when the
transaction ends, so every such read started new backends on the workers (7 to 20 ms of their
CPU for a claim's read across 32 shards on two workers, against 3.3 ms over one connection)."""


@dataclass(frozen=True)
class Prepared:
    """A hot statement to prepare once per connection; ``sql`` is written as any other."""

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


Statement = str | Prepared


def fetch_one(conn: sa.Connection, statement: Statement, params: Params = NO_PARAMS) -> Row | None:
    """The first row of ``statement``, or ``None``."""
    return cast(Row | None, _run(conn, statement, params, "one"))


def fetch_all(conn: sa.Connection, statement: Statement, params: Params = NO_PARAMS) -> list[Row]:
    """Every row of ``statement``."""
    return cast(list[Row], _run(conn, statement, params, "all"))


def fetch_value(conn: sa.Connection, statement: Statement, params: Params = NO_PARAMS) -> Any:
    """The first column of the first row (the statement must return a row)."""
    row = fetch_one(conn, statement, params)
    if row is None:
        raise LookupError("the statement returned no row")
    return row[0]


def run(conn: sa.Connection, statement: Statement, params: Params = NO_PARAMS) -> int:
    """Execute ``statement`` for its effect; how many rows it affected."""
    return cast(int, _run(conn, statement, params, "count"))


def run_on_driver(connection: Any, statement: str, params: Params = NO_PARAMS) -> None:
    """Run ``statement`` on a bare driver connection: a ``LISTEN`` one, or the pool's ping."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@contextmanager
def single_statement(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A pooled connection in autocommit, for exactly one statement (which commits itself).

    Use it only where the work is one statement: a second one would commit
    separately. The connection goes back to the pool in its usual mode.
    """
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        driver.autocommit = True  # type: ignore[union-attr]
        info = conn.connection.info
        info[_SINGLE_KEY] = True
        try:
            yield conn
        finally:
            info.pop(_SINGLE_KEY, None)
            if not conn.invalidated and not driver.closed:  # type: ignore[union-attr]
                driver.autocommit = False  # type: ignore[union-attr]


def never_prepared(engine: sa.Engine) -> None:
    """Every connection of ``engine`` sends :class:`Prepared` statements as plain SQL.

    For a Citus worker taking queries itself: there ``EXECUTE`` of a statement on
    a distributed table costs more than the same text sent whole (measured on the
    local cluster: 0.40-0.43 ms of the node's CPU against 0.26-0.30 ms), where on
    one plain server it costs a third of it.
    """

    @sa.event.listens_for(engine, "connect")
    def plain_sql_only(dbapi_connection: Any, record: Any) -> None:
        record.info[_PREPARED_KEY] = None


def on_a_node(conn: sa.Connection) -> bool:
    """Whether ``conn`` runs a write routed to a Citus node (where a statement that Citus
    would run in steps sends the intermediate results to the node itself, and commits in two
    phases)."""
    return XACT_OPTION in conn.get_execution_options()


def coordinator_of(conn: sa.Connection) -> sa.Connection:
    """Where a ``NOTIFY`` of ``conn``'s transaction goes: ``conn``, or, in a write routed to a
    Citus node, the coordinator's transaction that commits after it."""
    found = conn.get_execution_options().get(COORDINATOR_OPTION)
    return found if isinstance(found, sa.Connection) else conn


def _run(conn: sa.Connection, statement: Statement, params: Params, want: _Want) -> Any:
    plain = statement if isinstance(statement, str) else statement.sql
    driver: Any = conn.connection.driver_connection
    found = _prologue_for(conn, driver)
    prologue = None if found is None else found[0]
    if found is not None:
        params = {**params, **found[1]}
    routed = conn.get_execution_options().get(XACT_OPTION)
    if routed is not None and (given := routed.prefix(plain)) is not None:
        prologue = (prologue or "") + given[0]
        params = {**params, **given[1]}
    if _observed(conn):
        sent = plain if prologue is None else prologue + plain
        result = conn.exec_driver_sql(sent, dict(params))
        if want == "count":
            return result.rowcount
        if want == "all":
            return [tuple(row) for row in result]
        first = result.first()
        return None if first is None else tuple(first)
    cursor = driver.cursor()
    text = _text_for(conn, driver, statement)
    try:
        try:
            cursor.execute(text if prologue is None else prologue + text, params)
        except Exception as error:
            if text == plain or getattr(error, "pgcode", None) not in _POOLER_CODES:
                raise
            conn.connection.info[_PREPARED_KEY] = None  # plain SQL on this connection from now on
            cursor.execute(plain if prologue is None else prologue + plain, params)
        if want == "count":
            outcome: Any = cursor.rowcount
        elif want == "all":
            outcome = cursor.fetchall()
        else:
            outcome = cursor.fetchone()
    except Exception as error:
        _raise_as_sqlalchemy(conn, error, plain, params, cursor)
    cursor.close()
    return outcome


def _prologue_for(conn: sa.Connection, driver: Any) -> tuple[str, dict[str, str]] | None:
    """The prologue (:data:`PROLOGUE` or :data:`CITUS_PROLOGUE`) and its parameters when this
    statement begins a transaction that needs one."""
    settings = conn.get_execution_options().get(SETTINGS_OPTION)
    if settings is None or not settings.needed:
        return None
    if driver.autocommit:
        begins = conn.connection.info.get(_SINGLE_KEY, False)
    else:
        begins = driver.info.transaction_status == _IDLE
    if not begins:
        return None
    if not settings.statement_timeout_ms:  # Citus without a timeout: the server's own stands
        return _ONE_CONNECTION_PER_WORKER, {}
    prologue = CITUS_PROLOGUE if settings.one_connection_per_worker else PROLOGUE
    return prologue, cast(dict[str, str], settings.params)


def _text_for(conn: sa.Connection, driver: Any, statement: Statement) -> str:
    """What to send for ``statement`` on this connection now."""
    if isinstance(statement, str):
        return statement
    info = conn.connection.info
    prepared: set[str] | None = info.setdefault(_PREPARED_KEY, set())
    if prepared is None or not driver.autocommit:
        # In a transaction a failed EXECUTE would abort it: prepared only in autocommit.
        return statement.sql
    if statement.name in prepared:
        return statement.execute
    prepared.add(statement.name)
    return statement.prepare_and_execute


def _observed(conn: sa.Connection) -> bool:
    """Whether anything listens to the engine's execution events or its errors.

    Listeners of the engine and of the ``Engine`` class (an APM, a test) are
    seen; about a microsecond per statement.
    """
    events = conn.engine.dispatch
    for name in _EXECUTION_EVENTS:
        if getattr(events, name):
            return True
    return bool(conn.dialect.dispatch.handle_error)


def _raise_as_sqlalchemy(
    conn: sa.Connection, error: Exception, sql: str, params: Params, cursor: Any
) -> NoReturn:
    """Raise what ``exec_driver_sql`` would raise for ``error``; drop a connection that died."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    disconnect = isinstance(error, dbapi_error) and conn.dialect.is_disconnect(
        error, conn.connection.driver_connection, cursor
    )
    with contextlib.suppress(Exception):  # a dead connection's cursor may refuse to close
        cursor.close()
    if not isinstance(error, dbapi_error):
        raise error
    wrapped = sa.exc.DBAPIError.instance(
        sql,
        dict(params),
        error,
        dbapi_error,
        hide_parameters=True,
        connection_invalidated=disconnect,
        dialect=conn.dialect,
    )
    if disconnect:
        conn.invalidate(wrapped)
        conn.engine.dispose()  # the server went away: every pooled connection is suspect
    elif not conn.in_transaction():
        # Outside a transaction SQLAlchemy knows of, end the one the driver began (as it would).
        with contextlib.suppress(Exception):  # the failure above is what the caller must see
            conn.connection.driver_connection.rollback()  # type: ignore[union-attr]
    raise wrapped from error
