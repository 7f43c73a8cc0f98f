"""Gauges per push subscription: its lag behind the changes stream, and its failures.

``routemaster_subscription_pending`` (changes after the cursor that it
takes), ``routemaster_subscription_oldest_pending_seconds`` (the age of the
oldest of those, 0 when none) and ``routemaster_subscription_failures_in_a_row``,
labelled by ``subscription``, and ``routemaster_subscription_lost_events_total``
(changes retention removed or skipped before the subscription was sent
them). Counted at most every ``interval`` seconds per process (a lag is
counted over the history index from the cursor, so a subscription far behind
costs in proportion), never once per scrape.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from routemaster.db import subscriptions as store
from routemaster.db.horizon import Horizon
from routemaster.metrics.throttled import ThrottledReading

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriptionLag:
    name: str
    pending: int
    oldest_seconds: float
    failures_in_a_row: int
    lost_events: int = 0


def subscription_lags(engine: sa.Engine, horizon: Horizon) -> list[SubscriptionLag]:
    """Every subscription's lag, read now."""
    now = datetime.datetime.now(datetime.UTC)
    lags = []
    with engine.connect() as conn:
        for subscription in store.all_subscriptions(conn):
            lag = store.lag(conn, subscription, horizon)
            oldest = lag.oldest_pending_at
            lags.append(
                SubscriptionLag(
                    subscription.name,
                    lag.pending,
                    max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0,
                    subscription.failures_in_a_row,
                    subscription.lost_events,
                )
            )
    return lags


class SubscriptionGauges(Collector):
    def __init__(
        self,
        engine: sa.Engine,
        horizon: Horizon,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reading = ThrottledReading(
            lambda: subscription_lags(engine, horizon),
            what="subscription gauges",
            logger=logger,
            interval=interval,
            clock=clock,
        )

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        lags = self.lags()
        families = (
            ("routemaster_subscription_pending", "Changes after the cursor.", "pending"),
            (
                "routemaster_subscription_oldest_pending_seconds",
                "Age of the oldest change not yet acknowledged (0: none).",
                "oldest_seconds",
            ),
            (
                "routemaster_subscription_failures_in_a_row",
                "Failed sends of the batch in flight.",
                "failures_in_a_row",
            ),
        )
        for name, documentation, field in families:
            family = GaugeMetricFamily(name, documentation, labels=["subscription"])
            for lag in lags:
                family.add_metric([lag.name], getattr(lag, field))
            yield family
        lost = CounterMetricFamily(
            "routemaster_subscription_lost_events",
            "Changes retention removed or skipped before they were sent.",
            labels=["subscription"],
        )
        for lag in lags:
            lost.add_metric([lag.name], lag.lost_events)
        yield lost

    def lags(self) -> list[SubscriptionLag]:
        lags = self._reading.get()
        return lags if lags is not None else []
