"""Contexts for exit-condition tests: a fixed clock and feeds served from a dict."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from routemaster.exit_conditions import Context, FeedUnavailable

NOW = datetime.datetime(2024, 3, 1, 12, 0, tzinfo=datetime.UTC)

METADATA: dict[str, Any] = {
    "count": 3,
    "ratio": 0.75,
    "debt": -12,
    "flag": True,
    "off": False,
    "name": "alice",
    "quote": 'it\'s "quoted"\n',
    "tags": ["a", "b"],
    "numbers": [1, 2.5],
    "user": {"address": {"city": "London"}},
    "paid_at": "2024-02-28T12:00:00Z",
    "naive_at": "2024-03-01T11:00:00",
    "now_text": "2024-03-01T12:00:00+00:00",
    "closing": "18:30",
    "nothing": None,
}

FEEDS: dict[str, Any] = {"jacquard": {"variant": "b", "score": 7}, "empty": {}}


class FeedServer:
    """A ``fetch_feed`` callback serving :data:`FEEDS`, counting fetches per feed."""

    def __init__(self, feeds: Mapping[str, Any], down: frozenset[str] = frozenset()) -> None:
        self.feeds = feeds
        self.down = down
        self.fetches: dict[str, int] = {}

    def __call__(self, name: str) -> Any:
        self.fetches[name] = self.fetches.get(name, 0) + 1
        if name in self.down:
            raise FeedUnavailable(name, "503 from http://feeds.test")
        return self.feeds.get(name)


MakeContext = Callable[..., Context]


@pytest.fixture
def make_context() -> MakeContext:
    """Build a context at :data:`NOW`, two days into the state, with :data:`METADATA`."""

    def make(
        metadata: Mapping[str, Any] = METADATA,
        *,
        now: datetime.datetime = NOW,
        entered_state: datetime.datetime | None = NOW - datetime.timedelta(days=2),
        feeds: FeedServer | None = None,
    ) -> Context:
        return Context(
            label="label-1",
            metadata=metadata,
            now=now,
            entered_state=entered_state,
            previous_state="start",
            current_state="waiting",
            fetch_feed=feeds if feeds is not None else FeedServer(FEEDS),
        )

    return make
