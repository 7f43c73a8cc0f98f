"""Gauges per receiver: its state, calls in flight, labels waiting, failures in a row.

Read from the database (the receivers' shared rows and a count of their
labels) at most every ``interval`` seconds per process; every receiver the
configuration reaches is reported, so alert rules never meet a missing series.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from routemaster.config.model import Config
from routemaster.config.origins import configured_receivers
from routemaster.db import receiver_labels, receivers
from routemaster.metrics.throttled import ThrottledReading

logger = logging.getLogger(__name__)

STATES = ("closed", "open", "half_open", "paused")


@dataclass(frozen=True)
class _Reading:
    state: dict[str, str]
    failures: dict[str, int]
    counts: dict[str, tuple[int, int]]  # waiting, in flight


class ReceiverGauges(Collector):
    def __init__(
        self,
        engine: sa.Engine,
        config: Config,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._receivers = configured_receivers(config)
        self._routes = [
            (receiver.id, machine, state)
            for receiver in self._receivers.values()
            for machine, state in receiver.action_states
        ]
        self._reading = ThrottledReading(
            self._read, what="receiver gauges", logger=logger, interval=interval, clock=clock
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reading = self._reading.get()
        if reading is None:
            return
        ids = sorted(set(self._receivers) | set(reading.state))
        state = GaugeMetricFamily(
            "routemaster_receiver_state",
            "1 for the state each receiver is in (closed, open, half_open, paused), else 0.",
            labels=["receiver", "state"],
        )
        in_flight = GaugeMetricFamily(
            "routemaster_receiver_in_flight",
            "Calls in flight to the receiver.",
            labels=["receiver"],
        )
        waiting = GaugeMetricFamily(
            "routemaster_receiver_waiting",
            "Labels due for the receiver and not yet sent (its backlog).",
            labels=["receiver"],
        )
        failures = GaugeMetricFamily(
            "routemaster_receiver_failures_in_a_row",
            "Consecutive failed calls (timeouts, network errors, 5xx, 429).",
            labels=["receiver"],
        )
        for ident in ids:
            current = reading.state.get(ident, "closed")
            for name in STATES:
                state.add_metric([ident, name], 1 if name == current else 0)
            due, held = reading.counts.get(ident, (0, 0))
            waiting.add_metric([ident], due)
            in_flight.add_metric([ident], held)
            failures.add_metric([ident], reading.failures.get(ident, 0))
        yield from (state, in_flight, waiting, failures)

    def _read(self) -> _Reading:
        with self._engine.connect() as conn:
            rows = receivers.all_receivers(conn)
            counts = receiver_labels.counts(
                conn, self._routes, now=datetime.datetime.now(datetime.UTC)
            )
        return _Reading(
            state={row.id: row.state for row in rows},
            failures={row.id: row.failures_in_a_row for row in rows},
            counts=counts,
        )
