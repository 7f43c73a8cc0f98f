"""Label searches: a page, a count or a sample of the live labels matching a compiled condition.

The one kind of statement of the store that is not a complete constant: a
search's condition is compiled at request time from the exit-condition
language (:mod:`routemaster.search`). Each such statement is still written
whole here (and in db/bulk.py) as a named template, complete SQL but for one
slot, :data:`CONDITION`, where the compiled condition goes; nothing else is
ever put into the text. The condition is made of fixed fragments and its own
``%(w0)s``, ``%(w1)s``, ... parameters (no value or path from the expression
is ever written into it, and it has no literal ``%``), so the statement is
run by the same runner with the template's parameters and the condition's
together. ``tests/db/test_statement_text.py`` lists these templates by name.

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
from routemaster.db.statements import fetch_all, fetch_value

CONDITION = "{condition}"
"""The slot of a search template where the compiled condition goes (exactly once)."""

# Templates: complete SQL but for the CONDITION slot (see the module's docstring).
_PAGE = """
    SELECT name, state FROM labels
    WHERE state_machine = %(sm)s AND NOT deleted AND name_key > %(after)s
      AND (CAST(%(state)s AS text) IS NULL OR state = %(state)s)
      AND (NOT %(errored)s OR errored)
      AND name_key BETWEEN %(lowest)s AND %(highest)s AND starts_with(name, %(prefix)s)
      AND ({condition})
    ORDER BY name_key LIMIT %(limit)s
    """

_COUNT = """
    SELECT count(*) FROM labels
    WHERE state_machine = %(sm)s AND NOT deleted
      AND (CAST(%(state)s AS text) IS NULL OR state = %(state)s)
      AND (NOT %(errored)s OR errored)
      AND name_key BETWEEN %(lowest)s AND %(highest)s AND starts_with(name, %(prefix)s)
      AND ({condition})
    """


class Search(NamedTuple):
    """Which live labels of a machine: the listing's filters and a compiled condition."""

    machine: str
    condition: str = "TRUE"
    params: Mapping[str, Any] = {}
    state: str | None = None
    errored: bool = False
    prefix: str = ""


NOT_ON_VERSION = "version IS NOT NULL AND version <> %(version_in_force)s"
"""A fixed fragment: labels that keep a version other than the one in force (bulk upgrade)."""


def not_on_version(search: Search, version: int) -> Search:
    """``search`` narrowed to labels not on ``version`` (and keeping one: ``continue``)."""
    return search._replace(
        condition=f"({search.condition}) AND {NOT_ON_VERSION}",
        params={**search.params, "version_in_force": version},
    )


def with_condition(template: str, search: Search) -> str:
    """``template`` with ``search``'s compiled condition in its :data:`CONDITION` slot."""
    if template.count(CONDITION) != 1:
        raise ValueError("a search template has exactly one condition slot")
    return template.replace(CONDITION, search.condition)


def filter_params(search: Search) -> dict[str, Any]:
    """The parameters of a search template's filters: the listing's and the condition's."""
    lowest, highest = prefix_bounds(search.prefix)
    return {
        **search.params,
        "sm": search.machine,
        "state": search.state,
        "errored": search.errored,
        "prefix": search.prefix,
        "lowest": lowest,
        "highest": highest,
    }


def page_statement(search: Search, *, after: str, limit: int) -> tuple[str, dict[str, Any]]:
    """The SQL and parameters of :func:`search_page` (tests read its plan)."""
    params = {**filter_params(search), "after": label_key(after), "limit": limit}
    return with_condition(_PAGE, search), params


def count_statement(search: Search) -> tuple[str, dict[str, Any]]:
    """The SQL and parameters of :func:`search_count`."""
    return with_condition(_COUNT, search), filter_params(search)


def search_page(
    conn: sa.Connection, search: Search, *, after: str, limit: int
) -> list[tuple[str, str]]:
    """Up to ``limit`` matching labels whose keys follow ``after``'s, as ``(name, state)``."""
    statement, params = page_statement(search, after=after, limit=limit)
    return [(name, state) for name, state in fetch_all(conn, statement, params)]


def search_count(conn: sa.Connection, search: Search) -> int:
    """How many live labels match."""
    statement, params = count_statement(search)
    return int(fetch_value(conn, statement, params))
