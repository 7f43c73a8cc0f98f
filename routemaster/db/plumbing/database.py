"""Where the database is, and the engine (connection pool) that talks to it."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.pool import ConnectionPoolEntry

from routemaster.db.statements import fetch_value, run_on_driver
from routemaster.db.transaction_settings import set_statement_timeout, settings_of

_PING = "SELECT 1"

# Citus's catalog of distributed tables exists only where the extension is installed.
_CITUS_CATALOG = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
_LABELS_DISTRIBUTED = """
    SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                   WHERE logicalrelid = CAST('labels' AS regclass) AND partmethod = 'h')
    """
_DISTRIBUTED_OPTION = "routemaster_distributed"  # the engine execution option caching the answer


class DatabaseURLError(ValueError):
    """The configured database URL cannot be used; the message never holds the password."""


def url_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """``DATABASE_URL``, else the reference's ``DB_*`` variables, else ``None``.

    ``None`` means "no server was named": the CLI then falls back to the
    embedded PostgreSQL (see :mod:`routemaster.db.plumbing.embedded`). A URL that
    cannot be used raises :class:`DatabaseURLError`.
    """
    env = os.environ if environ is None else environ
    url = env.get("DATABASE_URL")
    if url:
        return checked_url(url, "DATABASE_URL")
    if any(env.get(key) for key in ("DB_HOST", "DB_NAME", "DB_USER", "DB_PORT", "DB_PASS")):
        port = env.get("DB_PORT") or None
        if port is not None and not port.isdigit():
            raise DatabaseURLError(f"DB_PORT must be a port number, got {port!r}")
        # 1.x's defaults for the variables left unset.
        return URL.create(
            "postgresql+psycopg2",
            username=env.get("DB_USER") or "routemaster",
            password=env.get("DB_PASS") or None,
            host=env.get("DB_HOST") or "localhost",
            port=int(port) if port else 5432,
            database=env.get("DB_NAME") or "routemaster",
        ).render_as_string(hide_password=False)
    return None


DIRECT_URL_VARIABLE = "ROUTEMASTER_DIRECT_DATABASE_URL"


def direct_url_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """``ROUTEMASTER_DIRECT_DATABASE_URL``: a connection straight to PostgreSQL, or ``None``.

    An option, never a requirement: where ``DATABASE_URL`` names a
    transaction-mode pooler, the ``LISTEN`` connections and migrations use
    it, so wake-ups stay immediate. ``None`` (unset or empty): ``LISTEN`` is
    tried on ``DATABASE_URL`` itself, checked, and wake-ups are polled where
    it does not work (docs/deployment.md).
    """
    env = os.environ if environ is None else environ
    url = env.get(DIRECT_URL_VARIABLE)
    return checked_url(url, DIRECT_URL_VARIABLE) if url else None


def checked_url(url: str, name: str = "the database URL") -> str:
    """``url`` normalised, or :class:`DatabaseURLError` saying (without the URL) what is wrong."""
    normalised = normalise_url(url)
    try:
        parsed = sa.engine.make_url(normalised)
    except sa.exc.ArgumentError:
        raise DatabaseURLError(
            f"{name} is not a database URL like postgresql://user:password@host:5432/database"
        ) from None
    except ValueError:
        raise DatabaseURLError(
            f"{name} is not a valid database URL: its host or port cannot be read"
        ) from None
    if parsed.get_backend_name() != "postgresql":
        raise DatabaseURLError(
            f"{name} must name a PostgreSQL database (postgresql://...), "
            f"not {parsed.get_backend_name()!r}"
        )
    return normalised


def safe_url(url: str) -> str:
    """``url`` with the password masked, for messages."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return "<unreadable URL>"


def normalise_url(url: str) -> str:
    """Accept libpq-style ``postgres://`` URLs as well as SQLAlchemy ones."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://") :]
    return url


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    idle_ping_after: float = 1.0,
    statement_timeout: float | None = None,
) -> sa.Engine:
    """A pooled engine that survives a database restart without a restart of its own.

    ``statement_timeout`` (seconds; ``None`` or 0: none) is set in every
    transaction (:mod:`routemaster.db.transaction_settings`: per transaction,
    so it holds behind a transaction-mode pooler), so no statement (a huge
    merge, a wait on a lock) runs away with a connection and a row lock.
    Parameters are left out of exception texts: they are label metadata and
    belong in no log. Nothing is set per connection: no startup ``options``
    (PgBouncer refuses them), no ``SET``.

    A connection that sat idle in the pool for ``idle_ping_after`` seconds is
    pinged before use (a dead one is replaced); a busy one is not, so the ping
    costs nothing under load. A connection that fails mid-use invalidates the
    whole pool (SQLAlchemy's disconnect handling), so an outage costs at most
    the requests made during it.
    """
    engine = sa.create_engine(
        normalise_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_recycle=3600,
        hide_parameters=True,
    )
    set_statement_timeout(engine, statement_timeout)
    _ping_connections_idle_for(engine, idle_ping_after)
    return engine


def _ping_connections_idle_for(engine: sa.Engine, seconds: float) -> None:
    @sa.event.listens_for(engine, "checkin")
    def remember_when(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()
        notifies = getattr(dbapi_connection, "notifies", None)
        if notifies:  # strays a pooler passed on (routemaster.db.notifications): never read
            notifies.clear()

    @sa.event.listens_for(engine, "checkout")
    def ping_if_idle(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < seconds:
            return
        try:
            run_on_driver(dbapi_connection, _PING)
            dbapi_connection.rollback()
        except Exception as error:
            # The pool throws this connection away and checks out another.
            raise sa.exc.DisconnectionError(str(error)) from error


def distributed(bind: sa.Engine | sa.Connection) -> bool:
    """Whether the database is a Citus cluster with ``labels`` distributed.

    Asked once per engine (kept in its execution options): a database is
    distributed by ``routemaster migrate``, which processes started before it
    would not see anyway. Where the answer changes what a statement must look
    like (claims shard by shard, the changes stream's horizon), code asks this.
    Given the connection a caller holds, the first question runs on it: taking
    a second one from a small pool (``migrate``'s) could wait for ever.
    """
    engine = bind.engine if isinstance(bind, sa.Connection) else bind
    found = engine.get_execution_options().get(_DISTRIBUTED_OPTION)
    if isinstance(found, bool):
        return found
    if isinstance(bind, sa.Connection):
        answer = _labels_distributed(bind)
    else:
        with engine.connect() as conn:
            answer = _labels_distributed(conn)
    engine.update_execution_options(**{_DISTRIBUTED_OPTION: answer})
    if answer:  # every transaction from now on: statements across shards on one connection
        settings_of(engine).one_connection_per_worker = True
    return answer


def _labels_distributed(conn: sa.Connection) -> bool:
    return bool(fetch_value(conn, _CITUS_CATALOG)) and bool(fetch_value(conn, _LABELS_DISTRIBUTED))
