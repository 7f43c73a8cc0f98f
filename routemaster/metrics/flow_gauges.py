"""Gauges per flow (SPEC G2): labels waiting for their key's turn, labels holding a slot.

Read from the database at most every ``interval`` seconds per process (the queues' and
holders' partial indexes); every flow the configuration names is reported.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterator

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from routemaster.config.model import Action, Config
from routemaster.db import flows
from routemaster.db.flows import FlowCounts
from routemaster.metrics.throttled import ThrottledReading

logger = logging.getLogger(__name__)


class FlowGauges(Collector):
    def __init__(
        self,
        engine: sa.Engine,
        config: Config,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        states: dict[str, list[tuple[str, str]]] = {}
        for machine in config.state_machines:
            for state in machine.states:
                if isinstance(state, Action) and state.flow is not None:
                    states.setdefault(state.flow.name, []).append((machine.name, state.name))
        self._flows = sorted(states.items())
        self._reading = ThrottledReading(
            self._read, what="flow gauges", logger=logger, interval=interval, clock=clock
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self._flows:
            return
        counts = self._reading.get()
        if counts is None:
            return
        waiting = GaugeMetricFamily(
            "routemaster_flow_waiting",
            "Labels queued in the flow, waiting for their key's turn or cap.",
            labels=["flow"],
        )
        holding = GaugeMetricFamily(
            "routemaster_flow_holding",
            "Labels holding a slot of the flow (calls in flight, tasks).",
            labels=["flow"],
        )
        for count in counts:
            waiting.add_metric([count.name], count.labels_waiting)
            holding.add_metric([count.name], count.holding)
        yield from (waiting, holding)

    def _read(self) -> list[FlowCounts]:
        with self._engine.connect() as conn:
            now = datetime.datetime.now(datetime.UTC)
            return flows.flow_counts(conn, self._flows, now=now)
