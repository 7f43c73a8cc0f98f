"""Read-only queries: label pages, counts per state, the states in use, the health ping.

Listings page by name (keyset: ``name > :after ORDER BY name``), so each page
is an index range scan whose cost depends on the page size, not on how many
labels or how much history the machine has.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import sqlalchemy as sa


class StateCount(NamedTuple):
    labels: int
    errored: int


_PAGE = sa.text(
    """
    SELECT name, state FROM labels
    WHERE state_machine = :sm AND NOT deleted AND name > :after
    ORDER BY name LIMIT :limit
    """
)

_PAGE_IN_STATE = sa.text(
    """
    SELECT name, state FROM labels
    WHERE state_machine = :sm AND state = :state AND NOT deleted AND name > :after
    ORDER BY name LIMIT :limit
    """
)

_PAGE_ERRORED = sa.text(
    """
    SELECT name, state FROM labels
    WHERE state_machine = :sm AND errored AND NOT deleted AND name > :after
      AND (CAST(:state AS text) IS NULL OR state = :state)
    ORDER BY name LIMIT :limit
    """
)

_PAGE_PREFIX = sa.text(
    """
    SELECT name, state FROM labels
    WHERE state_machine = :sm AND NOT deleted AND name > :after
      AND starts_with(name, :prefix)
      AND (CAST(:state AS text) IS NULL OR state = :state)
    ORDER BY name LIMIT :limit
    """
)

_PING = sa.text("SELECT 1")

_STATES_IN_USE = sa.text("SELECT DISTINCT state_machine, state FROM labels WHERE NOT deleted")

_COUNTS = sa.text(
    """
    SELECT state, count(*) AS labels, count(*) FILTER (WHERE errored) AS errored FROM labels
    WHERE state_machine = :sm AND NOT deleted
    GROUP BY state
    """
)


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
    """Up to ``limit`` live labels named after ``after``, as ``(name, state)``, by name.

    ``errored`` keeps only errored labels (an index of their own); ``prefix``
    only names that start with it. Given a connection rather than an engine,
    it reads in that connection's transaction (and snapshot).
    """
    params = {"sm": machine, "state": state, "after": after, "limit": limit, "prefix": prefix}
    opened = source.connect() if isinstance(source, sa.Engine) else contextlib.nullcontext(source)
    with opened as connection:
        if errored:
            result = connection.execute(_PAGE_ERRORED, params)
        elif prefix:
            result = connection.execute(_PAGE_PREFIX, params)
        elif state is None:
            result = connection.execute(_PAGE, {"sm": machine, "after": after, "limit": limit})
        else:
            result = connection.execute(
                _PAGE_IN_STATE, {"sm": machine, "state": state, "after": after, "limit": limit}
            )
        return [(name, label_state) for name, label_state in result]


def label_counts(engine: sa.Engine, machine: str) -> dict[str, StateCount]:
    """How many live labels, and how many of them errored, are in each state.

    States with no labels are absent.
    """
    with engine.connect() as connection:
        return count_labels(connection, machine)


def count_labels(conn: sa.Connection, machine: str) -> dict[str, StateCount]:
    """:func:`label_counts` in the caller's transaction (and snapshot)."""
    return {
        row.state: StateCount(row.labels, row.errored)
        for row in conn.execute(_COUNTS, {"sm": machine})
    }


def ping(engine: sa.Engine) -> None:
    """Raise ``sqlalchemy.exc.SQLAlchemyError`` unless the database answers."""
    with engine.connect() as connection:
        connection.execute(_PING)


def states_in_use(engine: sa.Engine) -> list[tuple[str, str]]:
    """Every (machine, state) holding live labels."""
    with engine.connect() as connection:
        return [(row.state_machine, row.state) for row in connection.execute(_STATES_IN_USE)]
