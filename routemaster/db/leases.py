"""One process at a time: a session advisory lock on a direct connection, else a lease row.

Work that spans many transactions (recording a configuration and applying
its migrations, building search indexes) must run in one process at a time.
With a direct connection to PostgreSQL (``App.direct``) that is a session
advisory lock, released by the server if the process dies. Behind a
transaction-mode pooler with no direct connection there is no session to
hold one (the lock would stay on whichever server connection ran it), so
the process holds a row of ``leases`` instead: taken when it is free or has
run out (judged by the database's clock, so no process's clock matters),
renewed by a thread every third of :data:`LEASE_SECONDS` while held, and
deleted when done. A process that dies holding it delays the next holder
by at most :data:`LEASE_SECONDS`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from routemaster.db.statements import fetch_one, run, single_statement

logger = logging.getLogger(__name__)

LEASE_SECONDS = 30.0
RETRY_EVERY = 0.25  # seconds between attempts to take a lease that is held, when waiting

_LOCK = "SELECT pg_advisory_lock(%(key)s)"
_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"
_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

# Taken when free or run out; renewed by the same statement when already ours.
_TAKE = """
    INSERT INTO leases (name, holder, expires_at)
    VALUES (%(name)s, %(holder)s, clock_timestamp() + make_interval(secs => %(seconds)s))
    ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE leases.expires_at < clock_timestamp() OR leases.holder = excluded.holder
    RETURNING holder
    """

_GIVE_UP = "DELETE FROM leases WHERE name = %(name)s AND holder = %(holder)s"


@contextmanager
def exclusive(
    engine: sa.Engine, direct: sa.Engine | None, *, key: int, name: str, wait: bool
) -> Iterator[bool]:
    """Hold the lock ``key`` (on ``direct``) or the lease ``name`` (through ``engine``).

    Yields whether it is held: ``wait=False`` gives up at once when another
    process holds it; ``wait=True`` waits for it.
    """
    if direct is not None:
        with _advisory(direct, key, wait=wait) as held:
            yield held
    else:
        with _lease(engine, name, wait=wait) as held:
            yield held


@contextmanager
def _advisory(direct: sa.Engine, key: int, *, wait: bool) -> Iterator[bool]:
    with direct.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        if wait:
            run(conn, _LOCK, {"key": key})
            held = True
        else:
            row = fetch_one(conn, _TRY_LOCK, {"key": key})
            held = bool(row and row[0])
        try:
            yield held
        finally:
            if held and not conn.invalidated:
                run(conn, _UNLOCK, {"key": key})


@contextmanager
def _lease(engine: sa.Engine, name: str, *, wait: bool) -> Iterator[bool]:
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    while not take_lease(engine, name, holder):
        if not wait:
            yield False
            return
        stop.wait(RETRY_EVERY)
    renewer = threading.Thread(
        target=_renew, args=(engine, name, holder, stop), name=f"lease {name}", daemon=True
    )
    renewer.start()
    try:
        yield True
    finally:
        stop.set()
        renewer.join()
        try:
            with single_statement(engine) as conn:
                run(conn, _GIVE_UP, {"name": name, "holder": holder})
        except sa.exc.SQLAlchemyError:
            logger.warning("could not give up the lease %r; it runs out by itself", name)


def take_lease(
    engine: sa.Engine, name: str, holder: str, *, seconds: float = LEASE_SECONDS
) -> bool:
    """Take (or renew) the lease ``name`` for ``holder``; whether ``holder`` has it now."""
    with single_statement(engine) as conn:
        row = fetch_one(conn, _TAKE, {"name": name, "holder": holder, "seconds": seconds})
    return row is not None


def _renew(engine: sa.Engine, name: str, holder: str, stop: threading.Event) -> None:
    while not stop.wait(LEASE_SECONDS / 3):
        try:
            if not take_lease(engine, name, holder):
                logger.warning("lost the lease %r: another process took it after it ran out", name)
                return
        except sa.exc.SQLAlchemyError:
            logger.warning("could not renew the lease %r; will try again", name)
