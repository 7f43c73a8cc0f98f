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
import time
from collections.abc import Callable, Iterator

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from routemaster.db import retention_progress as store
from routemaster.metrics.throttled import ThrottledReading

logger = logging.getLogger(__name__)


class RetentionGauges(Collector):
    def __init__(
        self, engine: sa.Engine, *, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._engine = engine
        self._reading = ThrottledReading(
            self._read, what="retention gauges", logger=logger, interval=interval, clock=clock
        )

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
        progress = self._reading.get()
        return progress if progress is not None else []

    def _read(self) -> list[store.Progress]:
        with self._engine.connect() as conn:
            return store.progress(conn)
