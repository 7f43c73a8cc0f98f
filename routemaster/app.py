"""The application object: everything a request handler or worker needs, passed explicitly.

There are no module-level singletons: the web app (``create_app`` in
:mod:`routemaster.web`) and the worker each build one :class:`App` per process
and hand it down.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import requests
import sqlalchemy as sa

from routemaster.config.model import Config
from routemaster.db.horizon import Horizon
from routemaster.hooks import Hooks
from routemaster.http.client import outbound_session
from routemaster.logging import BaseLogger
from routemaster.machine.definitions import LoadedVersions

if TYPE_CHECKING:  # imported for real only by whoever builds the App: see routemaster.metrics
    from routemaster.metrics import Metrics

Clock = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def system_zone() -> datetime.tzinfo:
    """The host's local zone (``TZ``, else ``/etc/localtime``), with its DST rules.

    Daily time triggers without a ``timezone`` use it, as 1.x did. A fixed
    UTC offset would be wrong on the other side of a DST change, so the
    zone's rules are loaded; only a host with neither falls back to UTC.
    """
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with open("/etc/localtime", "rb") as localtime:
            return ZoneInfo.from_file(localtime, key="localtime")
    except (OSError, ValueError):
        return datetime.UTC


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Settings:
    """Tunables, with production defaults; each is overridable from the environment by the CLI."""

    max_request_body: int = 1024 * 1024  # bytes; larger bodies get 413
    max_json_depth: int = 128  # nesting levels of any JSON body (and of metadata, feeds)
    statement_timeout: float = 10.0  # seconds any one database statement may run; 0: none
    max_response_body: int = 1024 * 1024  # bytes read of a webhook or feed answer
    feed_timeout_in_request: float = 2.0  # seconds; a request never waits longer on one feed
    feed_timeout: float = 10.0  # seconds, in the worker
    max_transitions: int = 50  # per processing step, so a config loop cannot spin forever
    lease: datetime.timedelta = datetime.timedelta(seconds=60)  # claimed work reclaimable after
    # a gate whose evaluation failed (a feed is down) is evaluated again after
    evaluation_retry_delay: datetime.timedelta = datetime.timedelta(seconds=30)
    delivery_concurrency: int = 16  # webhook deliveries in flight per worker process
    batch_size: int = 500  # labels claimed per worker transaction
    poll_interval: float = 1.0  # seconds between worker polls when idle
    # changes streams (per API process): how often open streams look for new
    # changes, how often an idle stream sends a keep-alive comment, how many may be open
    changes_poll_interval: float = 0.25
    stream_heartbeat: float = 15.0
    max_streams: int = 500
    max_waiting_claims: int = 1000  # POST /tasks/claim with "wait" waiting at once, per process
    # pull-worker tasks older than this are forgotten (their ids then answer 404)
    task_retention: datetime.timedelta = datetime.timedelta(days=7)
    worker_id: str = field(default_factory=_default_worker_id)
    metrics: bool = True  # Prometheus metrics (GET /metrics, cron --metrics-bind)
    # on Citus, a read of one label goes to the node holding its shard (docs/performance.md)
    route_reads: bool = True
    # on Citus, a write of one label goes to the node holding its shard (docs/performance.md)
    route_writes: bool = True
    label_gauges_interval: float = 5.0  # seconds; label counts for /metrics at most this often
    token_use_interval: float = 30.0  # seconds; tokens' last use is written this often
    # push subscriptions (per worker process): batches in flight at once, each send's total
    # deadline, how long a claimed subscription stays leased, how often an idle sender
    # looks for new changes, and the backoff of a failed batch (doubling, with jitter)
    subscription_concurrency: int = 8
    subscription_timeout: float = 10.0
    subscription_lease: float = 30.0
    subscription_poll: float = 0.02
    subscription_backoff: float = 1.0
    subscription_max_backoff: float = 600.0
    # the delivery log keeps each outbound call this long (workers prune older ones)
    delivery_retention: datetime.timedelta = datetime.timedelta(days=14)
    # finished bulk jobs and their item lists are kept this long (the leader prunes them)
    bulk_retention: datetime.timedelta = datetime.timedelta(days=30)
    retention_interval: float = 60.0  # seconds between pruning runs (retention:, bulk jobs)
    migrations_interval: float = 30.0  # seconds; workers re-apply the config's migrations


@dataclass
class App:
    """``db`` serves every transaction (it may be a transaction-mode pooler); ``direct``, when
    given (never required), is a connection straight to PostgreSQL for the ``LISTEN``
    connections. Without it they are made on ``db`` itself, and relied on only while a probe
    ``NOTIFY`` shows that notifications arrive there; where they do not, wake-ups are polled
    every ``poll_interval`` (:mod:`routemaster.db.notifications`, docs/deployment.md).
    """

    config: Config
    db: sa.Engine
    settings: Settings = field(default_factory=Settings)
    clock: Clock = utc_now
    http: requests.Session = field(default_factory=outbound_session)
    loggers: tuple[BaseLogger, ...] = ()  # the config's logging plugins
    metrics: Metrics | None = None  # its observer is one of ``loggers``
    system_zone: datetime.tzinfo = field(default_factory=system_zone)  # read once per process
    # the machine versions this process runs, and older ones it has compiled (SPEC E4);
    # replaced whole when it learns one (routemaster.service.versions)
    versions: LoadedVersions = field(default_factory=LoadedVersions)
    direct: sa.Engine | None = None
    # how far the changes stream may read: on Citus confirmed by the workers, once for every
    # stream and the subscription sender of this process (routemaster.db.horizon)
    horizon: Horizon = field(default_factory=Horizon, repr=False, compare=False)
    _hooks: Hooks | None = field(default=None, init=False, repr=False, compare=False)

    def now(self) -> datetime.datetime:
        return self.clock()

    @property
    def hooks(self) -> Hooks:
        """What calls the plugins' hooks; follows ``loggers`` if it is replaced."""
        if self._hooks is None or self._hooks.plugins != self.loggers:
            self._hooks = Hooks(self.loggers)
        return self._hooks
