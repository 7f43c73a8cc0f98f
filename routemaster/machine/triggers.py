"""Which events evaluate a gate: pure rules, as thread/routemaster 1.x has them."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from routemaster.config.model import (
    EntryTrigger,
    Gate,
    IntervalTrigger,
    MetadataTrigger,
    State,
    TimerTrigger,
    TimeTrigger,
)


def evaluates_on_entry(state: State) -> bool:
    """Whether a label entering ``state`` (created in it, or moved into it) evaluates it now."""
    return isinstance(state, Gate) and any(isinstance(t, EntryTrigger) for t in state.triggers)


def update_fires(state: State, patch: Mapping[str, Any]) -> bool:
    """Whether a metadata update with body ``patch`` fires one of the gate's metadata triggers.

    A trigger on ``a.b`` fires when the body itself contains the nested path
    ``a.b`` (whatever its value, null included). Replacing the parent
    (``{"a": 5}``) or touching a sibling (``{"a": {"c": 1}}``) does not.
    """
    if not isinstance(state, Gate):
        return False
    return any(
        _contains_path(patch, trigger.path)
        for trigger in state.triggers
        if isinstance(trigger, MetadataTrigger)
    )


def _contains_path(body: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    value: Any = body
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return False
        value = value[key]
    return bool(path)


def what_evaluates(gate: Gate) -> str | None:
    """In words, for a person: which events evaluate a label waiting in this gate.

    ``None`` when none does (only an entry trigger, already past).
    """
    events = []
    for trigger in gate.triggers:
        if isinstance(trigger, MetadataTrigger):
            events.append("an update whose body sets metadata." + ".".join(trigger.path))
        elif isinstance(trigger, IntervalTrigger):
            events.append(f"the interval trigger (every {_duration(trigger.interval)})")
        elif isinstance(trigger, TimeTrigger):
            events.append(f"the daily time trigger ({trigger.time.isoformat('minutes')})")
        elif isinstance(trigger, TimerTrigger):
            events.append("its next check (the timer trigger)")
    return " or ".join(events) or None


def _duration(interval: datetime.timedelta) -> str:
    """``1h30m`` rather than ``1:30:00``: as durations are written in the configuration."""
    seconds = int(interval.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"
