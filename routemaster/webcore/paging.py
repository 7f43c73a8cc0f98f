"""Keyset paging, the one way every listing of both faces pages.

A page asks the store for one row more than it shows: that row says there
is a next page, which starts after the last row shown (a key the listing
orders by: a label's name, a version number, a delivery's position). The
``next`` link repeats the request's filters with that key, so a client
follows links and never builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import quote, urlencode

Row = TypeVar("Row")


@dataclass(frozen=True)
class Page(Generic[Row]):
    """The rows shown, and the last of them when more follow (``None``: the last page)."""

    rows: Sequence[Row]
    last: Row | None


def page_of(fetch: Callable[[int], Sequence[Row]], limit: int) -> Page[Row]:
    """The page ``fetch(n)`` gives (its first ``n`` rows from where the page starts)."""
    rows = fetch(limit + 1)
    if len(rows) > limit:
        return Page(rows[:limit], rows[limit - 1])
    return Page(rows, None)


def next_link(path: str, query: Mapping[str, str]) -> str:
    """``path`` with ``query`` (in its order), each value percent-encoded."""
    return path + "?" + urlencode(query, quote_via=quote)
