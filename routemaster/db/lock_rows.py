"""One process at a time: a lease row, whether ``DATABASE_URL`` names PostgreSQL or a pooler.

Work that spans many transactions (recording a configuration and applying
its migrations, building search indexes) must run in one process at a time.
The process holds a row of ``leases``: taken when it is free or has run out
(judged by the database's clock, so no process's clock matters), renewed
by a thread every third of :data:`LEASE_SECONDS` while held, and deleted
when done. A process that dies holding it delays the next holder by at
most :data:`LEASE_SECONDS`.

Why a row and not an advisory lock: the one mechanism must work the same
with ``DATABASE_URL`` alone, whether it names the server or a
transaction-mode pooler. A session advisory lock needs a session, which a
pooler does not keep (the lock would stay on whichever server connection
ran it, held for no one); a transaction-scoped one
(``pg_try_advisory_xact_lock``) ends with its transaction, and the work it
guards is many transactions (each migration batch commits on its own) or
none at all (``CREATE INDEX CONCURRENTLY`` refuses to run in one). A lease
row is plain rows and statements, the same through any pooler, with or
without ``ROUTEMASTER_DIRECT_DATABASE_URL``; its one cost, the wait after a
holder dies, falls on start-up and index builds, never on a request.
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
def exclusive(engine: sa.Engine, *, name: str, wait: bool) -> Iterator[bool]:
    """Hold the lease ``name``; yields whether it is held.

    ``wait=False`` gives up at once when another process holds it;
    ``wait=True`` waits for it.
    """
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
