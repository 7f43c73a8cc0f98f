"""``NOTIFY routemaster_due`` when work becomes due, and a listener that waits for it.

The notification is a hint that saves workers a poll interval; correctness
never depends on it (work is found by ``due_at`` either way).
"""

from __future__ import annotations

import logging
import select
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from routemaster.db.statements import run, run_on_driver

logger = logging.getLogger(__name__)

DUE_CHANNEL = "routemaster_due"

_NOTIFY_DUE = "NOTIFY routemaster_due"

_LISTEN_DUE = "LISTEN routemaster_due"


def notify_due(conn: sa.Connection) -> None:
    """Wake listening workers when this transaction commits."""
    run(conn, _NOTIFY_DUE)


class DueListener:
    """``LISTEN routemaster_due`` on a dedicated connection, outside the pool.

    The engine must reach PostgreSQL directly (``App.direct``): a transaction
    pooler hands notifications to no one. With ``None`` (a pooler and no
    direct URL) it listens to nothing, and the caller's timeout (at most its
    poll interval) is the wake-up bound.

    :meth:`wait` also returns when any of the extra file descriptors becomes
    readable, so a worker can sleep on notifications and on its own threads'
    wake-ups in one ``select``. If the connection fails, it sleeps on those
    alone and reconnects on the next call.
    """

    def __init__(self, engine: sa.Engine | None) -> None:
        self._engine = engine
        self._proxy: Any = None
        self._connection: Any = None

    def wait(self, timeout: float, wake_fds: Sequence[int] = ()) -> list[int]:
        """Sleep up to ``timeout`` seconds; the extra descriptors that became readable."""
        if timeout <= 0:
            return []
        watched: list[Any] = list(wake_fds)
        if self._engine is None:
            readable, _, _ = select.select(watched, [], [], timeout)
            return [fd for fd in readable if isinstance(fd, int)]
        try:
            connection = self._connect()
        except Exception:
            logger.debug("LISTEN connection unavailable; sleeping without it", exc_info=True)
            self.close()
            connection = None
        if connection is not None:
            watched.append(connection)
        readable, _, _ = select.select(watched, [], [], timeout)
        if connection is not None and connection in readable:
            try:
                connection.poll()
                connection.notifies.clear()
            except Exception:
                logger.debug("LISTEN connection lost", exc_info=True)
                self.close()
        return [fd for fd in readable if isinstance(fd, int)]

    def close(self) -> None:
        if self._proxy is not None:
            try:
                self._proxy.close()
            except Exception:
                logger.debug("closing the LISTEN connection failed", exc_info=True)
        self._proxy = self._connection = None

    def _connect(self) -> Any:
        if self._connection is None:
            assert self._engine is not None
            proxy = self._engine.raw_connection()
            connection = proxy.driver_connection
            assert connection is not None
            proxy.detach()  # its session state (LISTEN, autocommit) must not go back to the pool
            connection.autocommit = True
            run_on_driver(connection, _LISTEN_DUE)
            self._proxy, self._connection = proxy, connection
        return self._connection
