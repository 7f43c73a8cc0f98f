"""Firing interval and daily-time triggers: the worker's clock, with explicit state.

Each occurrence (pure arithmetic in :mod:`routemaster.machine.clock`) is
recorded in the database by the first worker to compute it, which marks the
gate's labels due; the others see it recorded and do nothing.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from routemaster.app import App
from routemaster.config.model import (
    Config,
    IntervalTrigger,
    MetadataTimezone,
    NamedTimezone,
    SystemTimezone,
    TimeTrigger,
)
from routemaster.db import claims, occurrences
from routemaster.db.claims import StateKey
from routemaster.db.notifications import notify_due
from routemaster.machine.clock import (
    ScheduledTrigger,
    due_time_occurrence,
    interval_occurrence,
    scheduled_triggers,
)
from routemaster.worker.sweeps import PROCESS_GATE

logger = logging.getLogger(__name__)

MIN_OCCURRENCE_RETENTION = datetime.timedelta(days=7)


class ClockTriggers:
    """The config's clock triggers, the occurrences this worker has handled, the zones in use."""

    def __init__(
        self,
        app: App,
        sweep: Callable[[StateKey], None] | None = None,
        config: Config | None = None,
    ) -> None:
        """``sweep``: evaluates a gate's due labels; run after each occurrence handled here.

        ``config``: whose triggers (the worker's view, with older versions' gates).
        """
        self._app = app
        self._sweep = sweep
        self.triggers = list(scheduled_triggers(config or app.config))
        self._fixed_zones = {  # resolved once: the system zone is read from disk
            s.key: fixed_zone(s.trigger.timezone)
            for s in self.triggers
            if isinstance(s.trigger, TimeTrigger)
            and not isinstance(s.trigger.timezone, MetadataTimezone)
        }
        self._zones: dict[str, list[str]] = {}  # per-label-zone trigger key -> zones seen
        self._handled: dict[str, datetime.datetime] = {}  # occurrence key -> latest handled
        self.next_interval_at: datetime.datetime | None = None

    def fire(self) -> None:
        """Handle each trigger's current occurrence, unless some worker already has."""
        now = self._app.now()
        next_interval_at = None
        for scheduled in self.triggers:
            trigger = scheduled.trigger
            if isinstance(trigger, IntervalTrigger):
                latest = interval_occurrence(now, trigger.interval)
                self._fire(scheduled, scheduled.key, latest)
                following = latest + trigger.interval
                next_interval_at = min(following, next_interval_at or following)
            elif isinstance(trigger.timezone, MetadataTimezone):
                for name in self._zones.get(scheduled.key, []):
                    zone = label_zone(name)
                    if zone is not None:
                        self._fire(
                            scheduled,
                            f"{scheduled.key}/{name}",
                            due_time_occurrence(now, trigger.time, zone),
                            zone=(trigger.timezone.path[1:], name),
                        )
            else:
                fixed = self._fixed_zones[scheduled.key]
                self._fire(scheduled, scheduled.key, due_time_occurrence(now, trigger.time, fixed))
        self.next_interval_at = next_interval_at

    def refresh_zones(self) -> None:
        """Learn the zones labels name for per-label time triggers; forget old occurrences."""
        with self._app.db.begin() as conn:
            for scheduled in self.triggers:
                trigger = scheduled.trigger
                if isinstance(trigger, TimeTrigger) and isinstance(
                    trigger.timezone, MetadataTimezone
                ):
                    self._zones[scheduled.key] = claims.zones_in_gate(
                        conn, scheduled.machine.name, scheduled.state, trigger.timezone.path[1:]
                    )
            occurrences.forget_occurrences(conn, self._app.now() - self._retention())

    def _fire(
        self,
        scheduled: ScheduledTrigger,
        key: str,
        occurrence: datetime.datetime | None,
        *,
        zone: tuple[tuple[str, ...], str] | None = None,
    ) -> None:
        """``zone`` (metadata path, zone name) limits the occurrence to labels in that zone."""
        if occurrence is None or self._handled.get(key) == occurrence:
            return
        machine = scheduled.machine
        # 1.x's job for this trigger (routemaster.worker.sweeps): the firing and its evaluation.
        with self._app.hooks.cron(machine, machine.get_state(scheduled.state), PROCESS_GATE):
            self._record(scheduled, key, occurrence, zone)
            if self._sweep is not None:
                self._sweep((machine.name, scheduled.state))

    def _record(
        self,
        scheduled: ScheduledTrigger,
        key: str,
        occurrence: datetime.datetime,
        zone: tuple[tuple[str, ...], str] | None,
    ) -> None:
        """Record the occurrence; the first worker to do so marks the gate's labels due."""
        with self._app.db.begin() as conn:
            first = occurrences.record_occurrence(conn, key, occurrence)
            if first:
                count = claims.mark_gate_due(
                    conn,
                    scheduled.machine.name,
                    scheduled.state,
                    now=self._app.now(),
                    zone_path=zone[0] if zone else None,
                    zone=zone[1] if zone else None,
                )
                notify_due(conn)
        self._handled[key] = occurrence
        if first:
            logger.info(
                "trigger %s fired for %s: %d labels due", key, occurrence.isoformat(), count
            )
        else:
            logger.debug(
                "trigger %s already handled by another worker: %s", key, occurrence.isoformat()
            )

    def _retention(self) -> datetime.timedelta:
        intervals = [
            s.trigger.interval for s in self.triggers if isinstance(s.trigger, IntervalTrigger)
        ]
        return max([MIN_OCCURRENCE_RETENTION, *(2 * interval for interval in intervals)])


def fixed_zone(timezone: SystemTimezone | NamedTimezone) -> datetime.tzinfo:
    """The zone of a system- or named-timezone trigger."""
    if isinstance(timezone, NamedTimezone):
        return ZoneInfo(timezone.name)
    return system_zone()


def system_zone() -> datetime.tzinfo:
    """The worker host's local zone (``TZ``, else ``/etc/localtime``), with its DST rules.

    A fixed UTC offset would be wrong on the other side of a DST change, so
    the zone's rules are loaded; only a host with neither falls back to UTC.
    """
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        zone = label_zone(name)
        if zone is not None:
            return zone
    try:
        with open("/etc/localtime", "rb") as localtime:
            return ZoneInfo.from_file(localtime, key="localtime")
    except (OSError, ValueError):
        return datetime.UTC


def label_zone(name: object) -> ZoneInfo | None:
    """The zone a label's metadata names, or ``None`` when missing or not a valid IANA name."""
    if not isinstance(name, str) or not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None
