"""Gunicorn workers that let changes streams leave the request workers.

``serve`` runs these instead of gunicorn's own sync and gthread workers.
They differ in one thing: each client socket reaches the application as a
:class:`~routemaster.api.handoff.TakeableSocket`, so a changes stream can
take its connection to the process's stream thread and free the worker for
the next request (see :mod:`routemaster.api.handoff`). Without TLS only:
``serve`` never terminates TLS itself (a proxy in front does).
"""

from __future__ import annotations

from typing import Any

from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

from routemaster.api.handoff import TakeableSocket


class StreamingSyncWorker(SyncWorker):  # type: ignore[misc]
    """Gunicorn's sync worker: one request at a time, streams handed off."""

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        if not self.cfg.is_ssl:
            client = TakeableSocket(client)
        super().handle(listener, client, addr)


class StreamingThreadWorker(ThreadWorker):  # type: ignore[misc]
    """Gunicorn's gthread worker (``serve --threads``), streams handed off."""

    def enqueue_req(self, conn: Any) -> None:
        if not self.cfg.is_ssl and not isinstance(conn.sock, TakeableSocket):
            conn.sock = TakeableSocket(conn.sock)
        super().enqueue_req(conn)

    def handle_request(self, req: Any, conn: Any) -> bool:
        keep_alive = bool(super().handle_request(req, conn))
        # A taken connection belongs to the stream: never back to keep-alive.
        return keep_alive and not (isinstance(conn.sock, TakeableSocket) and conn.sock.taken)
