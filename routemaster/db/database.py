"""Where the database is, and the engine (connection pool) that talks to it."""

from __future__ import annotations

import os
from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import URL


def url_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """``DATABASE_URL``, else the reference's ``DB_*`` variables, else ``None``.

    ``None`` means "no server was named": the CLI then falls back to the
    embedded PostgreSQL (see :mod:`routemaster.db.embedded`).
    """
    env = os.environ if environ is None else environ
    url = env.get("DATABASE_URL")
    if url:
        return normalise_url(url)
    if any(env.get(key) for key in ("DB_HOST", "DB_NAME", "DB_USER")):
        return URL.create(
            "postgresql+psycopg2",
            username=env.get("DB_USER") or None,
            password=env.get("DB_PASS") or None,
            host=env.get("DB_HOST") or None,
            port=int(env["DB_PORT"]) if env.get("DB_PORT") else None,
            database=env.get("DB_NAME") or None,
        ).render_as_string(hide_password=False)
    return None


def normalise_url(url: str) -> str:
    """Accept libpq-style ``postgres://`` URLs as well as SQLAlchemy ones."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://") :]
    return url


def create_engine(url: str, *, pool_size: int = 5, max_overflow: int = 10) -> sa.Engine:
    """A pooled engine; ``pool_pre_ping`` so a restarted database is survived."""
    return sa.create_engine(
        normalise_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=3600,
        future=True,
    )
