"""When interval and daily-time triggers fire: pure functions of a given time and the config.

Occurrences are absolute instants (UTC), so every worker computes the same
ones; the worker records each in the database, and whichever worker gets
there first handles it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass

from routemaster.config.model import (
    Config,
    Gate,
    IntervalTrigger,
    StateMachine,
    TimeTrigger,
)

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

MISSED_TIME_GRACE = datetime.timedelta(hours=1)
"""A daily time missed because no worker ran is still honoured this long afterwards."""


@dataclass(frozen=True)
class ScheduledTrigger:
    """An interval or daily-time trigger of one gate, with a stable key for the database."""

    machine: StateMachine
    state: str
    index: int  # position in the gate's ``triggers`` list
    trigger: IntervalTrigger | TimeTrigger
    # an older version's trigger (a ``continue`` machine's, SPEC E4); ``None``: the configuration's
    version: int | None = None

    @property
    def key(self) -> str:
        key = f"{self.machine.name}/{self.state}/{self.index}"
        return key if self.version is None else f"{key}@v{self.version}"


def scheduled_triggers(config: Config) -> Iterator[ScheduledTrigger]:
    """Every clock-driven trigger in the config (metadata and entry triggers are not)."""
    for machine in config.state_machines:
        for state in machine.states:
            if not isinstance(state, Gate):
                continue
            for index, trigger in enumerate(state.triggers):
                if isinstance(trigger, IntervalTrigger | TimeTrigger):
                    yield ScheduledTrigger(machine, state.name, index, trigger)


def interval_occurrence(now: datetime.datetime, interval: datetime.timedelta) -> datetime.datetime:
    """The latest multiple of ``interval`` since the Unix epoch at or before ``now``.

    Aligning to the epoch (not to when a worker started) is what lets several
    workers agree on the same occurrence without talking to each other.
    """
    elapsed = now - EPOCH
    return EPOCH + interval * (elapsed // interval)


def daily_occurrence(
    now: datetime.datetime, at: datetime.time, zone: datetime.tzinfo
) -> datetime.datetime:
    """The latest instant at or before ``now`` when the wall clock in ``zone`` read ``at``.

    On a day when ``at`` does not exist (a DST gap) zoneinfo maps it past the
    gap; on a day when it happens twice, the first one counts.
    """
    local_today = now.astimezone(zone).date()
    for days_back in range(3):
        day = local_today - datetime.timedelta(days=days_back)
        candidate = datetime.datetime.combine(day, at.replace(tzinfo=None), tzinfo=zone)
        instant = candidate.astimezone(datetime.UTC)
        if instant <= now:
            return instant
    raise AssertionError("unreachable: some day in the last three had the time")


def due_time_occurrence(
    now: datetime.datetime, at: datetime.time, zone: datetime.tzinfo
) -> datetime.datetime | None:
    """The daily occurrence to handle now, or ``None`` when the latest one is too old."""
    occurrence = daily_occurrence(now, at, zone)
    if now - occurrence > MISSED_TIME_GRACE:
        return None
    return occurrence
