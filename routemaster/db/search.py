"""Label searches: a page, a count or a sample of the live labels matching a compiled condition.

The condition is SQL text with its own bound parameters (``:w0``, ``:w1``,
...), compiled from the exit-condition language by
:mod:`routemaster.search`; it is spliced whole into the statements below
in place of ``{condition}``, and no value is ever written into the text.
The other filters are the listing's own (state, errored, prefix), and pages
go by label key as every listing does, so a page that the condition matches
often costs a short index range scan. The statements run under the
engine's ``statement_timeout``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import sqlalchemy as sa

from routemaster.db.keys import label_key, prefix_bounds

_MATCHES = """
    state_machine = :sm AND NOT deleted
    AND (CAST(:state AS text) IS NULL OR state = :state)
    AND (NOT :errored OR errored)
    AND name_key BETWEEN :lowest AND :highest AND starts_with(name, :prefix)
    AND ({condition})
"""

_PAGE = """
    SELECT name, state FROM labels
    WHERE name_key > :after AND {matches}
    ORDER BY name_key LIMIT :limit
"""

_COUNT = "SELECT count(*) FROM labels WHERE {matches}"


class Search(NamedTuple):
    """Which live labels of a machine: the listing's filters and a compiled condition."""

    machine: str
    condition: str = "TRUE"
    params: Mapping[str, Any] = {}
    state: str | None = None
    errored: bool = False
    prefix: str = ""


def matches(search: Search) -> tuple[str, dict[str, Any]]:
    """The ``WHERE`` condition of ``search`` and its parameters (for db/bulk.py too)."""
    lowest, highest = prefix_bounds(search.prefix)
    params = {
        **search.params,
        "sm": search.machine,
        "state": search.state,
        "errored": search.errored,
        "prefix": search.prefix,
        "lowest": lowest,
        "highest": highest,
    }
    return _MATCHES.format(condition=search.condition), params


def search_page(
    conn: sa.Connection, search: Search, *, after: str, limit: int
) -> list[tuple[str, str]]:
    """Up to ``limit`` matching labels whose keys follow ``after``'s, as ``(name, state)``."""
    where, params = matches(search)
    query = sa.text(_PAGE.format(matches=where))
    rows = conn.execute(query, {**params, "after": label_key(after), "limit": limit})
    return [(name, state) for name, state in rows]


def search_count(conn: sa.Connection, search: Search) -> int:
    """How many live labels match."""
    where, params = matches(search)
    return int(conn.execute(sa.text(_COUNT.format(matches=where)), params).scalar_one())
