"""What the operators mean on the values a condition can see.

The rules, chosen so that evaluation never crashes on whatever metadata a
label carries: ``null`` equals only ``null``; values of incompatible types are
unequal and unordered (every ordering comparison involving them is false);
ints and floats compare numerically but booleans are not numbers; naive
datetimes and times of day are UTC; an ISO-8601 string compared with a
datetime (or time of day) is read as one.
"""

from __future__ import annotations

import datetime
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

_UTC = datetime.UTC
_ORDERED = (str, datetime.timedelta, datetime.datetime, datetime.time)
_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


def truthy(value: Any) -> bool:
    """The boolean a value stands for when used as a condition."""
    if value is None:
        return False
    if isinstance(value, (datetime.datetime, datetime.time)):
        return True
    try:
        return bool(value)
    except Exception:  # a context value with a broken __bool__ must not crash evaluation
        return False


def equal(left: Any, right: Any) -> bool:
    """``left = right`` under the rules above."""
    try:
        return _equal(*_coerce(left, right))
    except RecursionError:
        return False


def compare(op: str, left: Any, right: Any) -> bool:
    """Evaluate one of the six comparison operators."""
    if op == "=":
        return equal(left, right)
    if op == "/=":
        return not equal(left, right)
    left, right = _coerce(left, right)
    if _is_number(left) and _is_number(right):
        pass
    elif not any(isinstance(left, kind) and isinstance(right, kind) for kind in _ORDERED):
        return False
    try:
        return bool(_ORDERINGS[op](left, right))
    except (TypeError, ValueError, OverflowError):
        return False


def contains(container: Any, item: Any) -> bool:
    """``item is in container``: substring, list element or mapping key."""
    if isinstance(container, str):
        return isinstance(item, str) and item in container
    if isinstance(container, (list, tuple, Mapping)):
        return any(equal(item, element) for element in container)
    return False


def has_passed(duration: datetime.timedelta, since: Any, now: datetime.datetime) -> bool:
    """``duration has passed since since``; false when ``since`` is not a moment."""
    moment = as_datetime(since)
    if moment is None:
        return False
    return _utc_datetime(now) - moment >= duration


def as_datetime(value: Any) -> datetime.datetime | None:
    """A timezone-aware datetime from a datetime or an ISO-8601 string, else None."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime.datetime):
        return _utc_datetime(value)
    return None


def as_time(value: Any) -> datetime.time | None:
    """The time of day a comparison with ``system.time`` reads ``value`` as, else None.

    Naive and in UTC, as :func:`compare` normalises it; a datetime is not a
    time of day (comparing one with a time is false).
    """
    value = _time_or_self(value)
    return value if isinstance(value, datetime.time) else None


MAX_RENDER_DEPTH = 256


def to_json(value: Any, depth: int = 0) -> Any:
    """A JSON-safe rendering of a value, for explanations.

    Containers nested deeper than :data:`MAX_RENDER_DEPTH` are summarised
    instead of rendered, so no value (stored before a depth limit, or
    handed in by a caller) can make the rendering recurse without bound.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return format_duration(value)
    if isinstance(value, (Mapping, list, tuple)) and depth >= MAX_RENDER_DEPTH:
        return f"<{type(value).__name__} nested deeper than {MAX_RENDER_DEPTH} levels>"
    if isinstance(value, Mapping):
        return {str(key): to_json(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item, depth + 1) for item in value]
    return repr(value)


def format_duration(value: datetime.timedelta) -> str:
    """``1d12h30m`` style text for a duration, as the language writes it."""
    total = value.days * 86400 + value.seconds
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _equal(left: Any, right: Any) -> bool:
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if _is_number(left) and _is_number(right):
        return bool(left == right)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(map(equal, left, right))
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(equal(left[key], right[key]) for key in left)
    if any(isinstance(left, kind) and isinstance(right, kind) for kind in _ORDERED):
        return bool(left == right)
    return False


def _coerce(left: Any, right: Any) -> tuple[Any, Any]:
    """Normalise moments to UTC and read ISO strings facing a moment as one."""
    if isinstance(left, datetime.datetime) or isinstance(right, datetime.datetime):
        return _moment_or_self(left), _moment_or_self(right)
    if isinstance(left, datetime.time) or isinstance(right, datetime.time):
        return _time_or_self(left), _time_or_self(right)
    return left, right


def _moment_or_self(value: Any) -> Any:
    moment = as_datetime(value)
    return value if moment is None else moment


def _time_or_self(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = datetime.time.fromisoformat(value)
        except ValueError:
            return value
    if isinstance(value, datetime.time):
        return _utc_time(value)
    return value


def _utc_datetime(value: datetime.datetime) -> datetime.datetime:
    if value.utcoffset() is None:
        return value.replace(tzinfo=_UTC)
    return value


def _utc_time(value: datetime.time) -> datetime.time:
    """A naive time of day in UTC (naive input is taken to be UTC already)."""
    offset = value.utcoffset()
    naive = value.replace(tzinfo=None)
    if not offset:
        return naive
    # Any date works: only the time of day of the shifted moment is kept.
    shifted = datetime.datetime.combine(datetime.date(2000, 1, 2), naive) - offset
    return shifted.time()
