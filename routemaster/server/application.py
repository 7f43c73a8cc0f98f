"""Gunicorn as ``routemaster serve`` runs it: the application object, its defaults and options.

Everything about serving processes lives in this package: this module (what
gunicorn is told), :mod:`~routemaster.server.workers` (the worker classes:
bounded request lines, JSON error pages), :mod:`~routemaster.server.handoff`
(giving a stream's socket to the changes hub) and
:mod:`~routemaster.server.logs` (gunicorn's own lines as JSON).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.config import Config as GunicornConfig

from routemaster.server.handoff import taking_streams
from routemaster.server.logs import JsonGunicornLogger
from routemaster.server.workers import REQUEST_LIMITS, worker_class

DEFAULT_PORT = 2017


def default_bind() -> str:
    """``[::]:2017``, or ``0.0.0.0:2017`` where the host has no IPv6."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return f"0.0.0.0:{DEFAULT_PORT}"
    return f"[::]:{DEFAULT_PORT}"


def default_workers() -> int:
    configured = os.environ.get("WEB_CONCURRENCY")
    if configured:
        return int(configured)
    return workers_for(usable_cpus())


def workers_for(cpus: int) -> int:
    """One request worker per CPU, at least 2 (a slow request never holds every connection),
    at most 8.

    Measured on 2 cores (docs/performance.md): with connections kept alive and requests
    answered on the polling thread, one worker per CPU beat two per CPU by 15-30 % on reads
    (fewer processes taking turns on the cores) and matched it on creates.
    """
    return min(max(cpus, 2), 8)


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    return int(os.environ.get("WEB_THREADS") or 1)


def default_keep_alive() -> int:
    # Measured (docs/performance.md): with clients that keep their connections
    # alive, a worker that keeps them (server.workers.JsonErrorsKeepAlive) costs
    # less CPU per request than the sync worker, which closes each after one request.
    return int(os.environ.get("WEB_KEEPALIVE") or 2)


WSGIApp = Callable[..., Any]


class WorkerConfig(GunicornConfig):  # type: ignore[misc]
    """Gunicorn's settings, each looked up once in a worker instead of on every use.

    A sync worker reads about twenty settings per request through
    ``Config.__getattr__`` (a tenth of its own time per request in the
    profile). Settings cannot change in a forked worker, so after the fork
    (:meth:`freeze`) each value is kept as a plain attribute on first use.
    """

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        if self.__dict__.get("_frozen"):
            object.__setattr__(self, name, value)
        return value

    def freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)


def _freeze_worker_config(server: Any, worker: Any) -> None:
    worker.cfg.freeze()


class GunicornServer(BaseApplication):  # type: ignore[misc]
    """Gunicorn run in-process; ``build`` runs in each worker after the fork.

    Building there (``preload_app`` off) gives every worker its own database
    pool: a pool's sockets must never be shared across a fork.
    """

    def __init__(self, options: dict[str, Any], build: Callable[[], WSGIApp]) -> None:
        self._options = options
        self._build = build
        super().__init__()

    def load_default_config(self) -> None:
        self.cfg = WorkerConfig(self.usage, prog=self.prog)

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)
        self.cfg.set("post_fork", _freeze_worker_config)
        # Gunicorn >= 25.1 opens a control socket at one fixed path per user, which
        # several servers on one host would fight over; we do not use it.
        if "control_socket_disable" in self.cfg.settings:
            self.cfg.set("control_socket_disable", True)

    def load(self) -> WSGIApp:
        return self._build()


def run_server(
    build: Callable[[], WSGIApp],
    *,
    bind: str | None,
    workers: int | None,
    threads: int | None,
    keep_alive: int | None,
    json_logs: bool,
) -> None:
    """Serve the WSGI app ``build`` makes in each worker until gunicorn is told to stop."""
    worker_threads = threads or default_threads()
    keep_alive = default_keep_alive() if keep_alive is None else keep_alive

    def build_served() -> WSGIApp:
        return taking_streams(build())

    server = GunicornServer(
        {
            "bind": [bind or default_bind()],
            "workers": workers or default_workers(),
            "worker_class": worker_class(worker_threads, keep_alive=keep_alive > 0),
            "threads": worker_threads,
            "keepalive": keep_alive,
            "proc_name": "routemaster",
            "errorlog": "-",
            **({"logger_class": JsonGunicornLogger} if json_logs else {}),
            "loglevel": "info",
            **REQUEST_LIMITS,
        },
        build_served,
    )
    server.run()
