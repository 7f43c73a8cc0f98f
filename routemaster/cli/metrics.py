"""Metrics set-up for ``serve`` and ``cron``: part of the command line.

prometheus-client chooses between in-memory values and multiprocess files
when it is first imported, from ``PROMETHEUS_MULTIPROC_DIR``. So ``serve``
makes the directory and sets the variable before anything imports it (this
module does not import it at the top), and removes the directory when the
server stops; no operator set-up is needed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from routemaster.logging import BaseLogger

if TYPE_CHECKING:
    from routemaster.metrics import Metrics

MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# What 1.x's routemaster-prometheus reads (and empties whenever a process builds it).
PLUGIN_VARIABLE = "prometheus_multiproc_dir"


def wants_metrics_directory(metrics: bool) -> bool:
    """Our metrics are on, or a 1.x prometheus plugin is set up: values then live in our directory.

    prometheus-client writes to ``PROMETHEUS_MULTIPROC_DIR`` before the
    plugin's ``prometheus_multiproc_dir``, so the directory the plugin empties
    each time a process (an API, the worker) builds it holds no live values.
    """
    return metrics or PLUGIN_VARIABLE in os.environ


@contextmanager
def multiprocess_directory(enabled: bool, given: str | None = None) -> Iterator[str | None]:
    """A fresh directory for every process's values (gunicorn's workers, serve's worker).

    Removed afterwards only by the process that made it: gunicorn's workers
    are forks that unwind through the same code when they exit. ``given``: a
    directory a parent ``serve`` made (and removes).
    """
    if given is not None:
        os.environ[MULTIPROCESS_VARIABLE] = given
        yield given
        return
    if not enabled:
        yield None
        return
    directory = tempfile.mkdtemp(prefix="routemaster-metrics-")
    owner = os.getpid()
    os.environ[MULTIPROCESS_VARIABLE] = directory
    try:
        yield directory
    finally:
        if os.getpid() == owner:
            shutil.rmtree(directory, ignore_errors=True)
            os.environ.pop(MULTIPROCESS_VARIABLE, None)


def instrumented(
    loggers: tuple[BaseLogger, ...], directory: str | None
) -> tuple[Metrics, tuple[BaseLogger, ...]]:
    """Metrics, and the loggers with the metrics' observer added."""
    from routemaster.metrics import Metrics

    metrics = Metrics(multiprocess_dir=directory)
    return metrics, (*loggers, metrics.observer())


def split_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (every interface)."""
    host, separator, port = bind.rpartition(":")
    if not separator or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"expected HOST:PORT, got {bind!r}", param_hint="--metrics-bind")
    host = host.removeprefix("[").removesuffix("]")
    return host or "0.0.0.0", int(port)


@contextmanager
def worker_metrics(
    bind: str | None, loggers: tuple[BaseLogger, ...]
) -> Iterator[tuple[Metrics | None, tuple[BaseLogger, ...]]]:
    """The worker's metrics served on ``bind`` while the block runs (nothing when ``None``)."""
    if bind is None:
        yield None, loggers
        return
    host, port = split_bind(bind)
    # The worker is one process: its own values, even if the API's variable leaked in.
    os.environ.pop(MULTIPROCESS_VARIABLE, None)
    from prometheus_client import start_http_server

    metrics, observed = instrumented(loggers, None)
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry())
    except OSError as error:
        raise click.ClickException(f"cannot serve metrics on {bind}: {error.strerror}") from None
    click.echo(f"Metrics on http://{bind}/metrics", err=True)
    try:
        yield metrics, observed
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
