"""Sweeps: labels picked for upkeep (ended pauses, labels never scheduled, labels a receiver
has not answered for too long), locked for one transaction, never leased."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.catalogue import CLAIMABLE, IN_SHARD, RETURNED
from routemaster.db.label_claims.states import IN_STATES, StateKey, state_arrays
from routemaster.db.labels import Label, label_from_row
from routemaster.db.shards import take


def lock_ended(conn: sa.Connection, *, now: datetime.datetime, limit: int) -> list[Label]:
    """Lock up to ``limit`` paused labels whose pause has ended."""
    params = {"now": now, "limit": limit, "shard_keys": None}
    rows = take(conn, _ENDED_KEYS, _LOCK_ENDED, params)
    return [label_from_row(row) for row in rows]


def lock_unscheduled(conn: sa.Connection, states: Sequence[StateKey], *, limit: int) -> list[Label]:
    """Up to ``limit`` live rows in ``states`` written since their schedule was computed.

    Found through the partial index ``labels_unscheduled``, so the cost is
    that of the rows returned, never of the table. The ``ORDER BY`` of the
    index's columns is what makes PostgreSQL walk it: it cannot estimate how
    few rows the index's condition holds and would otherwise read the table
    (217 ms at a million labels, every few seconds).
    """
    if limit <= 0 or not states:
        return []
    params = {**state_arrays(states), "limit": limit, "shard_keys": None}
    rows = take(conn, _UNSCHEDULED_KEYS, _LOCK_UNSCHEDULED, params)
    return [label_from_row(row) for row in rows]


def lock_stale(
    conn: sa.Connection,
    states: Sequence[StateKey],
    *,
    cutoff: datetime.datetime,
    batch: int,
) -> list[tuple[str, str, int]]:
    """Lock up to ``batch`` labels in ``states`` due since before ``cutoff``: (sm, name, entry).

    Receivers' upkeep errors them in the same transaction (giving up on a
    receiver that has not answered for too long).
    """
    params = {
        "route_machines": [sm for sm, _ in states],
        "route_states": [state for _, state in states],
        "cutoff": cutoff,
        "batch": batch,
        "shard_keys": None,
    }
    rows = take(conn, _STALE_KEYS, _STALE, params, limit="batch")
    return [(str(sm), str(name), int(entry)) for sm, name, entry in rows]


# Each sweep's statement, ``shard_keys`` NULL on one server, on Citus every key of one shard;
# and on Citus the shard keys of its oldest labels, read without a lock across the shards
# (which shards to visit: routemaster.db.shards).

# Ended pauses.
_ENDED = "paused_until <= %(now)s AND paused AND NOT deleted"

_LOCK_ENDED = f"""
    SELECT {RETURNED}
    FROM labels
    WHERE {IN_SHARD}
      AND {_ENDED}
    ORDER BY paused_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

_ENDED_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_ENDED}
    ORDER BY paused_until
    LIMIT %(limit)s
    """

# Live rows written since their schedule was computed (index labels_unscheduled).
_UNSCHEDULED = f"""NOT deleted AND scheduled_at IS DISTINCT FROM updated_at AND lease_owner IS NULL
      AND {IN_STATES}"""

_LOCK_UNSCHEDULED = f"""
    SELECT {RETURNED}
    FROM labels
    WHERE {IN_SHARD}
      AND {_UNSCHEDULED}
    ORDER BY state_machine, state
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

_UNSCHEDULED_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_UNSCHEDULED}
    ORDER BY state_machine, state
    LIMIT %(limit)s
    """

# Labels due since before the cutoff, locked (skipping those another worker holds) until
# they are errored in the same transaction (routemaster.db.transitions).
_ROUTES = """routes AS (
        SELECT * FROM unnest(CAST(%(route_machines)s AS text[]), CAST(%(route_states)s AS text[]))
                 AS r(sm, state)
    )"""

_STALE_LABEL = f"""due_at < %(cutoff)s AND {CLAIMABLE}
      AND (state_machine, state) IN (SELECT sm, state FROM routes)"""

_STALE = f"""
    WITH {_ROUTES}
    SELECT state_machine, name, entry_id FROM labels
    WHERE {IN_SHARD}
      AND {_STALE_LABEL}
    ORDER BY due_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
    """

_STALE_KEYS = f"""
    WITH {_ROUTES}
    SELECT shard_key FROM labels
    WHERE {_STALE_LABEL}
    ORDER BY due_at LIMIT %(batch)s
    """
