"""Retention's progress in ``/metrics``, read from the database (pruning runs in the workers).

``routemaster_retention_rows_pruned_total{table}``: rows removed from each
table since retention started (``labels_finished``: labels deleted by
``finished:``, which the label rows' removal counts again after
``deleted:``), ``routemaster_retention_last_run_timestamp_seconds{table}``
and ``routemaster_retention_horizon_timestamp_seconds{table}`` (the last
run's cutoff: rows older than this are being pruned). Read at most every
``interval`` seconds per process, like the label gauges.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from routemaster.db import retention_progress as store

logger = logging.getLogger(__name__)


class RetentionGauges(Collector):
    def __init__(
        self, engine: sa.Engine, *, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._engine = engine
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._taken: tuple[float, list[store.Progress]] | None = None

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        progress = self.progress()
        pruned = CounterMetricFamily(
            "routemaster_retention_rows_pruned",
            "Rows retention removed, per table.",
            labels=["table"],
        )
        last_run = GaugeMetricFamily(
            "routemaster_retention_last_run_timestamp_seconds",
            "When pruning last ran on the table (Unix time).",
            labels=["table"],
        )
        horizon = GaugeMetricFamily(
            "routemaster_retention_horizon_timestamp_seconds",
            "The last run's cutoff: rows older than this are pruned (Unix time).",
            labels=["table"],
        )
        for row in progress:
            pruned.add_metric([row.table], row.rows_pruned)
            if row.last_run_at is not None:
                last_run.add_metric([row.table], row.last_run_at.timestamp())
            if row.horizon is not None:
                horizon.add_metric([row.table], row.horizon.timestamp())
        yield pruned
        yield last_run
        yield horizon

    def progress(self) -> list[store.Progress]:
        with self._lock:
            if self._taken is not None and self._clock() - self._taken[0] < self._interval:
                return self._taken[1]
            try:
                with self._engine.connect() as conn:
                    fresh = store.progress(conn)
            except sa.exc.SQLAlchemyError as error:
                logger.warning("retention gauges not refreshed: %s", type(error).__name__)
                return self._taken[1] if self._taken else []
            self._taken = (self._clock(), fresh)
            return fresh
