"""Reading JSON from outside (request bodies, feed answers) within documented bounds.

Every JSON document that comes from a client or a remote server is parsed
here: nesting deeper than a limit is refused (so nothing stored or fetched
can make later reads, explanations or the database's own recursion fail),
and so are strings PostgreSQL cannot hold (``\\u0000``, unpaired surrogates)
and the non-standard constants ``NaN``/``Infinity``. The checks are a loop
with an explicit stack, never recursion, so a hostile document costs time
linear in its size and no stack.
"""

from __future__ import annotations

import json
import re
from typing import Any

DEFAULT_MAX_DEPTH = 128

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class JSONRejected(ValueError):
    """The document is not JSON we accept; the message says why, for the sender."""


def parse_json(
    raw: bytes | str, *, max_depth: int = DEFAULT_MAX_DEPTH, wrapper_levels: int = 0
) -> Any:
    """The decoded document, or :class:`JSONRejected` naming the problem (and the limit).

    ``wrapper_levels`` outer levels (an envelope such as ``{"metadata": ...}``)
    are not counted against ``max_depth``.
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise JSONRejected(_too_deep(max_depth)) from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError among them
        raise JSONRejected(f"not valid JSON: {error}") from None
    check_json(value, max_depth=max_depth, wrapper_levels=wrapper_levels)
    return value


def check_json(value: Any, *, max_depth: int = DEFAULT_MAX_DEPTH, wrapper_levels: int = 0) -> None:
    """Refuse ``value`` if it nests deeper than ``max_depth`` or holds unstorable text.

    Depth counts containers: ``{}`` and ``[]`` are 1 level, ``{"a": [1]}`` is 2;
    a bare scalar is 0.
    """
    stack: list[tuple[Any, int]] = [(value, -wrapper_levels)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth + 1 > max_depth:
                raise JSONRejected(_too_deep(max_depth))
            for key, child in item.items():
                _check_text(key)
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif isinstance(child, str):
                    _check_text(child)
        elif isinstance(item, list):
            if depth + 1 > max_depth:
                raise JSONRejected(_too_deep(max_depth))
            for child in item:
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif isinstance(child, str):
                    _check_text(child)
        elif isinstance(item, str):
            _check_text(item)


def _check_text(text: str) -> None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    character = found.group()
    what = "\\u0000" if character == "\x00" else f"an unpaired surrogate (\\u{ord(character):04x})"
    raise JSONRejected(f"strings must not contain {what}: the database cannot store it")


def _too_deep(max_depth: int) -> str:
    return f"nested deeper than the limit of {max_depth} levels"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
