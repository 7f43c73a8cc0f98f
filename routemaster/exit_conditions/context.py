"""What an exit condition (and a context transition) can see.

The context is pure data plus one callback: feeds are fetched lazily by the
caller-supplied ``fetch_feed`` so that a condition that never reads
``feeds.X`` never causes an HTTP request, and one that reads it twice causes
one.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class FeedUnavailable(Exception):
    """A feed could not be fetched; the evaluation must not decide anything."""

    def __init__(self, feed: str, reason: str) -> None:
        super().__init__(f"feed {feed!r} unavailable: {reason}")
        self.feed = feed
        self.reason = reason


@dataclass
class Context:
    """The values a condition is evaluated against, for one label at one time.

    ``fetch_feed(name)`` returns the feed's decoded JSON or raises
    :class:`FeedUnavailable`; results are cached for the context's lifetime
    (one evaluation).
    """

    label: str
    metadata: Mapping[str, Any]
    now: datetime.datetime  # timezone-aware
    entered_state: datetime.datetime | None = None  # timezone-aware
    previous_state: str | None = None
    current_state: str | None = None
    fetch_feed: Callable[[str], Any] | None = None
    # a spawn state's children counted (total, succeeded, failed, running): SPEC G3
    children: Mapping[str, int] | None = None
    _feed_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def lookup(self, path: tuple[str, ...]) -> Any:
        """The value at ``path`` (``("metadata", "a", "b")``); ``None`` when missing."""
        if not path:
            return None
        root, rest = path[0], path[1:]
        if root == "metadata":
            return _dig(self.metadata, rest)
        if root == "feeds":
            if not rest:
                return None
            return _dig(self.feed(rest[0]), rest[1:])
        if root == "children":
            return _dig(self.children or {}, rest)
        if root in ("history", "system"):
            return _dig(self._system_values(root), rest)
        return None

    def feed(self, name: str) -> Any:
        if name not in self._feed_cache:
            if self.fetch_feed is None:
                raise FeedUnavailable(name, "no feed fetcher in this context")
            self._feed_cache[name] = self.fetch_feed(name)
        return self._feed_cache[name]

    def _system_values(self, root: str) -> dict[str, Any]:
        if root == "history":
            return {
                "entered_state": self.entered_state,
                "previous_state": self.previous_state,
                "current_state": self.current_state,
            }
        return {
            "now": self.now,
            "time": self.now.timetz(),
            "entered_state": self.entered_state,
            "label": self.label,
        }


def _dig(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if isinstance(value, Mapping):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit():
            index = int(key)
            value = value[index] if index < len(value) else None
        else:
            return None
        if value is None:
            return None
    return value
