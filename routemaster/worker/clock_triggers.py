"""Interval and daily-time triggers as they fire: 1.x's jobs, over labels already due.

Which labels an occurrence evaluates is written on their rows (``due_at``,
computed from each label's next check: :mod:`routemaster.service.scheduling`),
so firing a trigger touches no label that is still waiting: the worker's
loop evaluates the due ones whatever fires. What remains here is 1.x's
meaning of the occurrence itself: ``process_cron`` (``process_gate``) wraps
the gate's evaluation at each occurrence, the first worker to record it
counts it as handled, and how late the worker handled it is measured.

Occurrences (pure arithmetic in :mod:`routemaster.machine.clock`) of a daily
time in each label's own zone (``timezone: metadata.path``) are not fired
here: their labels fall due one by one, in their own zones.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable

from routemaster.app import App
from routemaster.config.model import IntervalTrigger, MetadataTimezone, TimeTrigger
from routemaster.machine.clock import (
    ScheduledTrigger,
    due_time_occurrence,
    interval_occurrence,
    scheduled_triggers,
)
from routemaster.machine.schedule import zone_of
from routemaster.service.clock_occurrences import forget_occurrences, record_occurrence
from routemaster.service.in_flight import StateKey
from routemaster.worker.sweeps import PROCESS_GATE

logger = logging.getLogger(__name__)

MIN_OCCURRENCE_RETENTION = datetime.timedelta(days=7)


class ClockTriggers:
    """The config's interval and fixed-zone daily triggers, and the occurrences handled here."""

    def __init__(
        self,
        app: App,
        sweep: Callable[[StateKey], None] | None = None,
        scheduled: Iterable[ScheduledTrigger] | None = None,
    ) -> None:
        """``sweep``: evaluates a gate's due labels; run at each occurrence handled here.

        ``scheduled``: the triggers to fire (a worker's: with older versions' gates, SPEC E4;
        :func:`routemaster.service.versions.worker_triggers`); the configuration's by default.
        """
        self._app = app
        self._sweep = sweep
        self.triggers = [
            s
            for s in (scheduled_triggers(app.config) if scheduled is None else scheduled)
            if not (
                isinstance(s.trigger, TimeTrigger)
                and isinstance(s.trigger.timezone, MetadataTimezone)
            )
        ]
        self._zones = {  # resolved once
            s.key: _fixed_zone(app, s.trigger)
            for s in self.triggers
            if isinstance(s.trigger, TimeTrigger)
        }
        self._handled: dict[str, datetime.datetime] = {}  # trigger key -> latest handled
        self.next_interval_at: datetime.datetime | None = None

    def fire(self) -> None:
        """Handle each trigger's current occurrence, unless this worker already has."""
        now = self._app.now()
        next_interval_at = None
        for scheduled in self.triggers:
            trigger = scheduled.trigger
            if isinstance(trigger, IntervalTrigger):
                latest = interval_occurrence(now, trigger.interval)
                self._fire(scheduled, latest, now)
                following = latest + trigger.interval
                next_interval_at = min(following, next_interval_at or following)
            elif isinstance(trigger, TimeTrigger):
                zone = self._zones[scheduled.key]
                self._fire(scheduled, due_time_occurrence(now, trigger.time, zone), now)
        self.next_interval_at = next_interval_at

    def forget_old_occurrences(self) -> None:
        """Occurrences are remembered only as long as a late worker could still fire them."""
        forget_occurrences(self._app, self._app.now() - self._retention())

    def _fire(
        self,
        scheduled: ScheduledTrigger,
        occurrence: datetime.datetime | None,
        now: datetime.datetime,
    ) -> None:
        key = scheduled.key
        if occurrence is None or self._handled.get(key) == occurrence:
            return
        self._handled[key] = occurrence
        machine = scheduled.machine
        # 1.x's job for this trigger (routemaster.worker.sweeps): the firing and its evaluation.
        with self._app.hooks.cron(machine, machine.get_state(scheduled.state), PROCESS_GATE):
            first = record_occurrence(self._app, key, occurrence)
            if self._sweep is not None:
                self._sweep((machine.name, scheduled.state))
        if self._app.metrics is not None:
            self._app.metrics.observe_occurrence(
                machine.name, scheduled.state, lag=(now - occurrence).total_seconds(), first=first
            )
        if first:
            logger.info("trigger %s fired for %s", key, occurrence.isoformat())
        else:
            logger.debug(
                "trigger %s already handled by another worker: %s", key, occurrence.isoformat()
            )

    def _retention(self) -> datetime.timedelta:
        intervals = [
            s.trigger.interval for s in self.triggers if isinstance(s.trigger, IntervalTrigger)
        ]
        return max([MIN_OCCURRENCE_RETENTION, *(2 * interval for interval in intervals)])


def _fixed_zone(app: App, trigger: IntervalTrigger | TimeTrigger) -> datetime.tzinfo:
    """A named or the system zone: metadata zones never come here (they are not fired)."""
    assert isinstance(trigger, TimeTrigger)
    zone = zone_of(trigger, {}, app.system_zone)
    assert zone is not None, "checked at load"
    return zone
