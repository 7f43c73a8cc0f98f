"""The small formats inside the configuration: durations, times of day, paths, equality."""

from __future__ import annotations

import datetime
import re
from typing import Any

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_TIME_UNITS = re.compile(r"(\d{1,2})h(?:(\d{1,2})m)?(?:(\d{1,2})s)?")
_TIME_COLONS = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")

CONTEXT_NEXT_ROOTS = ("metadata", "feeds", "history")
"""What a context transition's ``path`` may start with."""


def parse_duration(text: str) -> datetime.timedelta | None:
    """``1d2h30m15s`` (any units present, in that order) → timedelta; ``None`` if malformed."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()):
        return None
    days, hours, minutes, seconds = (int(group or 0) for group in match.groups())
    return datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def parse_time_of_day(text: str) -> datetime.time | None:
    """``18h30m`` or ``18:30`` (optionally with seconds) → time; ``None`` if malformed."""
    text = text.strip()
    match = _TIME_UNITS.fullmatch(text) or _TIME_COLONS.fullmatch(text)
    if match is None:
        return None
    hour, minute, second = (int(group or 0) for group in match.groups())
    if hour > 23 or minute > 59 or second > 59:
        return None
    return datetime.time(hour, minute, second)


def split_path(text: str) -> tuple[str, ...] | None:
    """``a.b.c`` → ``("a", "b", "c")``; ``None`` when empty or with an empty part."""
    parts = tuple(text.split("."))
    if not text or any(not part.strip() or part != part.strip() for part in parts):
        return None
    return parts


def same_value(left: Any, right: Any) -> bool:
    """Equality as metadata means it: ``1 == 1.0`` but ``True != 1``, at any depth."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(same_value, left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same_value(left[k], right[k]) for k in left)
    if isinstance(left, list | dict) or isinstance(right, list | dict):
        return False
    return bool(left == right)
