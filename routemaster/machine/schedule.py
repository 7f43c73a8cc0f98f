"""When the worker next evaluates a label waiting in a gate: pure arithmetic, no I/O.

SPEC E1. A label's **next check** is the earliest moment its exit condition
could hold with the metadata it has (solved by
:mod:`routemaster.exit_conditions.next_check`). The worker evaluates it at the
first occurrence of one of the gate's clock triggers at or after that moment
(an interval, a daily time in its zone, or the next check itself for
``event: timer``): its **due time**. Which labels move, and at which
occurrence, is the same as if every label of the gate were evaluated at every
occurrence, because between its next check and that occurrence no occurrence
could have moved it. A label that waits costs nothing until then.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from routemaster.config.model import (
    Gate,
    IntervalTrigger,
    MetadataTimezone,
    NamedTimezone,
    State,
    TimerTrigger,
    TimeTrigger,
    Trigger,
)
from routemaster.exit_conditions.context import Context
from routemaster.exit_conditions.next_check import NextCheck, compile_timing
from routemaster.machine.clock import EPOCH
from routemaster.machine.planning import PlanInput, context_for

_TICK = datetime.timedelta(microseconds=1)


@dataclass(frozen=True)
class GateSchedule:
    """A waiting label's next check, and when the worker evaluates it (``None``: never)."""

    next_check: NextCheck
    due_at: datetime.datetime | None

    @property
    def next_check_at(self) -> datetime.datetime | None:
        return self.next_check.at


def is_scheduled(state: State) -> bool:
    """Whether labels waiting in ``state`` are evaluated at moments (a clock or timer trigger)."""
    return isinstance(state, Gate) and any(_is_clock(trigger) for trigger in state.triggers)


def next_check(gate: Gate, plan_input: PlanInput, *, after: datetime.datetime) -> NextCheck:
    """The earliest moment at or after ``after`` when the gate's condition could hold."""

    def context_at(moment: datetime.datetime) -> Context:
        return context_for(plan_input, moment)

    return compile_timing(gate.exit_condition).next_check(context_at, after)


def schedule_gate(
    gate: Gate,
    plan_input: PlanInput,
    *,
    after: datetime.datetime,
    system_zone: datetime.tzinfo,
    retry_at: datetime.datetime | None = None,
) -> GateSchedule:
    """The next check of a label waiting in ``gate`` from ``after`` on, and its due time.

    ``retry_at``: after an evaluation that did not move the label, the
    earliest a timer trigger may evaluate it again when its condition may hold
    at any moment (it reads a feed): a timer gate must not spin on a feed.
    """
    check = next_check(gate, plan_input, after=after)
    if check.at is None:
        return GateSchedule(check, None)
    due: datetime.datetime | None = None
    for trigger in gate.triggers:
        occurrence = first_occurrence(
            trigger, check.at, metadata=plan_input.metadata, system_zone=system_zone
        )
        if isinstance(trigger, TimerTrigger) and retry_at is not None and check.at <= after:
            occurrence = retry_at
        if occurrence is not None and (due is None or occurrence < due):
            due = occurrence
    return GateSchedule(check, due)


def first_occurrence(
    trigger: Trigger,
    moment: datetime.datetime,
    *,
    metadata: Mapping[str, Any],
    system_zone: datetime.tzinfo,
) -> datetime.datetime | None:
    """The first time ``trigger`` evaluates the gate at or after ``moment``; ``None``: never.

    Interval occurrences are multiples of the interval since the Unix epoch
    (as :func:`routemaster.machine.clock.interval_occurrence` counts them);
    a daily time is the first instant its zone's wall clock reads it (on a
    day when DST skips it, zoneinfo's mapping past the gap); a zone read from
    metadata that is missing or unknown never fires, as in 1.x.
    """
    if isinstance(trigger, TimerTrigger):
        return moment
    if isinstance(trigger, IntervalTrigger):
        periods = -((EPOCH - moment) // trigger.interval)  # ceiling division
        return EPOCH + trigger.interval * periods
    if isinstance(trigger, TimeTrigger):
        zone = zone_of(trigger, metadata, system_zone)
        if zone is None:
            return None
        return daily_at_or_after(moment, trigger.time, zone)
    return None  # metadata and entry triggers are events, not moments


def daily_at_or_after(
    moment: datetime.datetime, at: datetime.time, zone: datetime.tzinfo
) -> datetime.datetime:
    """The first instant at or after ``moment`` when the wall clock in ``zone`` reads ``at``."""
    local_day = moment.astimezone(zone).date()
    for days in range(-1, 3):
        day = local_day + datetime.timedelta(days=days)
        candidate = datetime.datetime.combine(day, at.replace(tzinfo=None), tzinfo=zone)
        instant = candidate.astimezone(datetime.UTC)
        if instant >= moment:
            return instant
    raise AssertionError("unreachable: one of the next days has the time")


def label_zone(name: object) -> ZoneInfo | None:
    """The zone a label's metadata names, or ``None`` when missing or not a valid IANA name."""
    if not isinstance(name, str) or not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def after_evaluation(evaluated_at: datetime.datetime) -> datetime.datetime:
    """Where the next check of a label evaluated at ``evaluated_at`` without moving starts."""
    return evaluated_at + _TICK


def zone_of(
    trigger: TimeTrigger, metadata: Mapping[str, Any], system_zone: datetime.tzinfo
) -> datetime.tzinfo | None:
    """The zone a daily time is read in for a label with ``metadata`` (``None``: no valid one)."""
    timezone = trigger.timezone
    if isinstance(timezone, NamedTimezone):
        return ZoneInfo(timezone.name)
    if isinstance(timezone, MetadataTimezone):
        value: Any = metadata
        for key in timezone.path[1:]:
            value = value.get(key) if isinstance(value, Mapping) else None
        return label_zone(value)
    return system_zone


def _is_clock(trigger: Trigger) -> bool:
    return isinstance(trigger, IntervalTrigger | TimeTrigger | TimerTrigger)
