"""A scheduler using next checks moves the same labels at the same occurrences as 1.x.

1.x evaluated every label of a gate at every occurrence of its clock triggers; a
label moved at the first occurrence at which its condition held. Here a label is
evaluated only at its due time (:func:`routemaster.machine.schedule.schedule_gate`),
and after an evaluation that does not move it, at the next due time from then on.
For random conditions over every time construct, random metadata and entry
moments near daylight-saving changes, and interval and daily-time triggers, both
must pick the same occurrence (or none) over three days, with the real evaluator.
"""

from __future__ import annotations

import datetime
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from routemaster.config.model import (
    ConstantNext,
    Gate,
    IntervalTrigger,
    NamedTimezone,
    TimerTrigger,
    TimeTrigger,
    Trigger,
)
from routemaster.exit_conditions import compile_condition
from routemaster.machine.planning import PlanInput, context_for
from routemaster.machine.schedule import after_evaluation, schedule_gate
from tests.exit_conditions.strategies import time_conditions
from tests.exit_conditions.test_next_check_properties import afters, metadata

UTC = datetime.UTC
WINDOW = datetime.timedelta(days=3)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)
LONDON = ZoneInfo("Europe/London")

TRIGGERS: list[Trigger] = [
    IntervalTrigger(datetime.timedelta(minutes=7)),
    IntervalTrigger(datetime.timedelta(hours=1)),
    TimeTrigger(datetime.time(1, 30), NamedTimezone("Europe/London")),  # skipped once a year
    TimeTrigger(datetime.time(18, 30), NamedTimezone("UTC")),
]


def occurrences(
    trigger: Trigger, start: datetime.datetime, end: datetime.datetime
) -> list[datetime.datetime]:
    """Every occurrence in [start, end], counted here independently of the module."""
    if isinstance(trigger, IntervalTrigger):
        first = EPOCH + trigger.interval * -((EPOCH - start) // trigger.interval)
        count = (end - first) // trigger.interval + 1
        return [first + trigger.interval * step for step in range(max(count, 0))]
    assert isinstance(trigger, TimeTrigger) and isinstance(trigger.timezone, NamedTimezone)
    zone = ZoneInfo(trigger.timezone.name)
    found = []
    day = start.astimezone(zone).date() - datetime.timedelta(days=1)
    while day <= end.astimezone(zone).date() + datetime.timedelta(days=1):
        local = datetime.datetime.combine(day, trigger.time, tzinfo=zone)
        found.append(local.astimezone(UTC))
        day += datetime.timedelta(days=1)
    return sorted(moment for moment in found if start <= moment <= end)


def gate(source: str, trigger: Trigger) -> Gate:
    return Gate("waiting", compile_condition(source), (trigger,), ConstantNext("done"))


def every_occurrence(waiting: Gate, plan_input: PlanInput) -> datetime.datetime | None:
    """1.x: the first occurrence at which the condition holds."""
    for moment in occurrences(waiting.triggers[0], plan_input.entered_at, _end(plan_input)):
        if waiting.exit_condition.evaluate(context_for(plan_input, moment)):
            return moment
    return None


def by_next_checks(waiting: Gate, plan_input: PlanInput) -> datetime.datetime | None:
    """The worker: evaluate at the due time; if it does not move, at the next one."""
    due = schedule_gate(waiting, plan_input, after=plan_input.entered_at, system_zone=UTC).due_at
    for _ in range(5000):
        if due is None or due > _end(plan_input):
            return None
        if waiting.exit_condition.evaluate(context_for(plan_input, due)):
            return due
        after = after_evaluation(due)
        due = schedule_gate(waiting, plan_input, after=after, system_zone=UTC).due_at
    raise AssertionError("the scheduler never settled")


def _end(plan_input: PlanInput) -> datetime.datetime:
    return plan_input.entered_at + WINDOW


@st.composite
def labels(draw: st.DrawFn) -> tuple[str, Trigger, PlanInput]:
    entered = draw(afters())
    data: dict[str, Any] = draw(metadata(entered))
    source = draw(time_conditions(feeds=False))
    trigger = draw(st.sampled_from(TRIGGERS))
    return source, trigger, PlanInput("label-1", "waiting", data, entered, "start")


@settings(max_examples=150, deadline=None)
@given(labels())
def test_next_checks_move_labels_at_the_same_occurrences_as_evaluating_every_label(
    label: tuple[str, Trigger, PlanInput],
) -> None:
    source, trigger, plan_input = label
    waiting = gate(source, trigger)
    assert by_next_checks(waiting, plan_input) == every_occurrence(waiting, plan_input), source


@settings(max_examples=100, deadline=None)
@given(labels())
def test_a_timer_trigger_is_due_exactly_when_the_condition_first_holds(
    label: tuple[str, Trigger, PlanInput],
) -> None:
    """``event: timer``: the due time is the first moment the condition holds, if it ever does."""
    source, _, plan_input = label
    waiting = gate(source, TimerTrigger())
    due = schedule_gate(waiting, plan_input, after=plan_input.entered_at, system_zone=UTC).due_at
    if due is not None:
        assert waiting.exit_condition.evaluate(context_for(plan_input, due)), source
