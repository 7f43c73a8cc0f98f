"""Read-only queries: label pages and the health ping (counts per state: ``db/counts.py``).

Listings page by key (``name_key > key(after) ORDER BY name_key``; keys in
``db/keys.py``), so each page is an index range scan whose cost depends on
the page size, not on how many labels or how much history the machine has.
Key order is code-point order of the names, whatever the database's
collation (long names sharing their first 1,024 bytes sort by hash), and it
is a total order: following ``after`` visits every label once.
"""

from __future__ import annotations

import contextlib
from typing import Any

import sqlalchemy as sa

from routemaster.db.keys import label_key, prefix_bounds
from routemaster.db.statements import fetch_all, fetch_one

_PAGE = """
    SELECT name, state FROM labels
    WHERE state_machine = %(sm)s AND NOT deleted AND name_key > %(after)s
    ORDER BY name_key LIMIT %(limit)s
    """

_PAGE_IN_STATE = """
    SELECT name, state FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted AND name_key > %(after)s
    ORDER BY name_key LIMIT %(limit)s
    """

_PAGE_ERRORED = """
    SELECT name, state FROM labels
    WHERE state_machine = %(sm)s AND errored AND NOT deleted AND name_key > %(after)s
      AND (CAST(%(state)s AS text) IS NULL OR state = %(state)s)
      AND name_key BETWEEN %(lowest)s AND %(highest)s AND starts_with(name, %(prefix)s)
    ORDER BY name_key LIMIT %(limit)s
    """

# Every key from ``lowest`` to ``highest`` starts with the prefix's first 1,024 bytes:
# one range of the primary key, then ``starts_with`` for the (rare) longer prefixes.
_PAGE_PREFIX = """
    SELECT name, state FROM labels
    WHERE state_machine = %(sm)s AND NOT deleted AND name_key > %(after)s
      AND name_key BETWEEN %(lowest)s AND %(highest)s AND starts_with(name, %(prefix)s)
      AND (CAST(%(state)s AS text) IS NULL OR state = %(state)s)
    ORDER BY name_key LIMIT %(limit)s
    """

_PING = "SELECT 1"


def label_page(
    source: sa.Engine | sa.Connection,
    machine: str,
    *,
    after: str,
    limit: int,
    state: str | None = None,
    errored: bool = False,
    prefix: str = "",
) -> list[tuple[str, str]]:
    """Up to ``limit`` live labels whose keys follow ``after``'s, as ``(name, state)``, by key.

    ``errored`` keeps only errored labels (an index of their own); ``prefix``
    only names that start with it. Given a connection rather than an engine,
    it reads in that connection's transaction (and snapshot).
    """
    params: dict[str, Any] = {"sm": machine, "after": label_key(after), "limit": limit}
    if errored or prefix:
        lowest, highest = prefix_bounds(prefix)
        params.update(state=state, prefix=prefix, lowest=lowest, highest=highest)
        query = _PAGE_ERRORED if errored else _PAGE_PREFIX
    elif state is None:
        query = _PAGE
    else:
        params["state"] = state
        query = _PAGE_IN_STATE
    opened = source.connect() if isinstance(source, sa.Engine) else contextlib.nullcontext(source)
    with opened as connection:
        return [(name, label_state) for name, label_state in fetch_all(connection, query, params)]


def ping(engine: sa.Engine) -> None:
    """Raise ``sqlalchemy.exc.SQLAlchemyError`` unless the database answers."""
    with engine.connect() as connection:
        fetch_one(connection, _PING)
