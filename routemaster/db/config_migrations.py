"""The configuration's ``migrations:`` in the store: the lock that serialises them, and batches.

A rename is one statement per batch: the labels change state's name and
nothing else (entry, entered time, attempts, due time, lease, errored all
kept), and each gets a forced history row. A move is an entry into a new
state, so the label service does it one label at a time
(:func:`names_in_state` finds them).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from routemaster.db.lock_rows import exclusive
from routemaster.db.statements import fetch_all

CONFIG_LEASE = "configuration"
"""The lease row held while versions are recorded and migrations applied
(:mod:`routemaster.db.lock_rows`)."""


@contextmanager
def config_lock(engine: sa.Engine, *, wait: bool) -> Iterator[bool]:
    """Hold the configuration's lease row; whether it is held.

    ``wait=False`` gives up at once when another process holds it.
    """
    with exclusive(engine, name=CONFIG_LEASE, wait=wait) as held:
        yield held


def names_in_state(
    conn: sa.Connection,
    machine: str,
    state: str,
    *,
    now: datetime.datetime,
    limit: int,
    version: int | None = None,
) -> list[str]:
    """Up to ``limit`` live labels in ``state`` that no worker holds a lease on, in index order.

    ``version``: only labels that follow it or keep none (as
    :func:`routemaster.db.transitions.rename_batch`).
    """
    rows = fetch_all(
        conn,
        _NAMES_IN_STATE,
        {"sm": machine, "state": state, "now": now, "limit": limit, "version": version},
    )
    return [str(row[0]) for row in rows]


_NAMES_IN_STATE = """
    SELECT name FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted
      AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
      AND (CAST(%(version)s AS integer) IS NULL OR version IS NULL OR version = %(version)s)
    ORDER BY name_key
    LIMIT %(limit)s
    """
