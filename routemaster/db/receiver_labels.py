"""Receivers' labels: how many wait for each, retrying those errored against one, giving up.

A receiver's labels are those in the action states whose webhooks reach it
(its routes, from the configuration); none of these statements keeps a
list of labels per receiver.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.label_claims import lock_stale
from routemaster.db.receivers import Route, route_arrays
from routemaster.db.statements import fetch_all
from routemaster.db.transitions import Erring, become_errored, retry

"""(receiver id, state machine, action state): where an action's webhooks go."""

# Per receiver, its routes' labels waiting without a lease (``labels_awaiting_claim``: labels
# due in those states), then those under a lease, expired (waiting again) or not (in flight)
# (``labels_leased``): each read is bounded by the labels it counts, never by those stored.
_WAITING = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_receivers)s AS text[]),
                             CAST(%(route_machines)s AS text[]),
                             CAST(%(route_states)s AS text[])) AS r(receiver, sm, state)
    )
    SELECT routes.receiver, count(*)
    FROM routes JOIN labels ON labels.state_machine = routes.sm AND labels.state = routes.state
    WHERE labels.lease_owner IS NULL AND labels.due_at IS NOT NULL AND labels.due_at <= %(now)s
      AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
    GROUP BY routes.receiver
    """

_LEASED = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_receivers)s AS text[]),
                             CAST(%(route_machines)s AS text[]),
                             CAST(%(route_states)s AS text[])) AS r(receiver, sm, state)
    )
    SELECT routes.receiver,
           count(*) FILTER (WHERE labels.due_at <= %(now)s) AS waiting,
           count(*) FILTER (WHERE labels.due_at > %(now)s) AS in_flight
    FROM routes JOIN labels ON labels.state_machine = routes.sm AND labels.state = routes.state
    WHERE labels.lease_owner IS NOT NULL AND labels.due_at IS NOT NULL
      AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
    GROUP BY routes.receiver
    """

# The labels errored in these states within [since, until), in the order they are locked.
# When a label became errored: its ``errored`` history entry for its current entry into the
# state (the hash index on ``history.label`` finds it; after the entry by position, as ids
# from a write routed to a Citus node come from that node's range), or for labels errored
# before such entries were written, when the row last changed.
_ERRORED_BETWEEN = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_machines)s AS text[]), CAST(%(route_states)s AS text[]))
                 AS r(sm, state)
    ), errored AS (
        SELECT labels.state_machine, labels.name,
               COALESCE(
                   (SELECT max(history.created) FROM history
                    WHERE history.shard_key = labels.shard_key AND history.label = labels.name
                      AND history.state_machine = labels.state_machine
                      AND history.kind = 'errored'
                      AND (history.xact_id, history.id) > (
                          SELECT entry.xact_id, entry.id FROM history AS entry
                          WHERE entry.shard_key = labels.shard_key
                            AND entry.id = labels.entry_id)),
                   labels.updated_at) AS errored_at
        FROM labels
        WHERE labels.errored AND NOT labels.deleted
          AND (labels.state_machine, labels.state) IN (SELECT sm, state FROM routes)
    )
    SELECT state_machine, name FROM errored
    WHERE errored_at >= %(since)s AND errored_at < %(until)s
    ORDER BY state_machine, name
    """


def counts(
    conn: sa.Connection, routes: Sequence[Route], *, now: datetime.datetime
) -> dict[str, tuple[int, int]]:
    """Per receiver: (labels waiting for it, calls in flight to it)."""
    if not routes:
        return {}
    params = {**route_arrays(routes), "now": now}
    found = {receiver: (int(n), 0) for receiver, n in fetch_all(conn, _WAITING, params)}
    for receiver, waiting, in_flight in fetch_all(conn, _LEASED, params):
        free, _ = found.get(receiver, (0, 0))
        found[receiver] = (free + int(waiting), int(in_flight))
    return found


def retry_errored(
    conn: sa.Connection,
    states: Sequence[tuple[str, str]],
    *,
    since: datetime.datetime,
    until: datetime.datetime,
    now: datetime.datetime,
    reason: str,
) -> int:
    """Make due again every label errored in these states within [since, until): how many.

    All are retried as any retry is, in one statement
    (:func:`routemaster.db.transitions.retry`); one retried or deleted meanwhile by
    someone else is left alone.
    """
    if not states:
        return 0
    found = fetch_all(conn, _ERRORED_BETWEEN, {**_pairs(states), "since": since, "until": until})
    keys = [(str(machine), str(name)) for machine, name in found]
    return len(retry(conn, keys, now=now, reason=reason))


def give_up(
    conn: sa.Connection,
    states: Sequence[tuple[str, str]],
    *,
    cutoff: datetime.datetime,
    now: datetime.datetime,
    reason: str,
    batch: int,
) -> int:
    """Error up to ``batch`` labels in these states due since before ``cutoff``: how many.

    Run in a transaction: the labels stay locked from being picked to being errored.
    """
    if not states:
        return 0
    stale = lock_stale(conn, states, cutoff=cutoff, batch=batch)
    erring = [Erring(machine, name, entry_id, reason) for machine, name, entry_id in stale]
    return len(become_errored(conn, erring, now=now))


def _pairs(states: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    return {"route_machines": [sm for sm, _ in states], "route_states": [s for _, s in states]}
