"""Receivers' labels: how many wait for each, retrying those errored against one, giving up.

A receiver's labels are those in the action states whose webhooks reach it
(its routes, from the configuration); none of these statements keeps a
list of labels per receiver.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.errored import Erring, become_errored
from routemaster.db.history import version_arrays
from routemaster.db.notifications import notify_due
from routemaster.db.receivers import Route, route_arrays
from routemaster.db.shards import shard_map
from routemaster.db.statements import fetch_all, run

"""(receiver id, state machine, action state): where an action's webhooks go."""

_COUNTS = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_receivers)s AS text[]),
                             CAST(%(route_machines)s AS text[]),
                             CAST(%(route_states)s AS text[])) AS r(receiver, sm, state)
    )
    SELECT routes.receiver,
           count(*) FILTER (WHERE labels.due_at <= %(now)s) AS waiting,
           count(*) FILTER (WHERE labels.lease_owner IS NOT NULL AND labels.due_at > %(now)s)
               AS in_flight
    FROM routes JOIN labels ON labels.state_machine = routes.sm AND labels.state = routes.state
    WHERE NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
      AND labels.due_at IS NOT NULL
    GROUP BY routes.receiver
    """

# When a label became errored: its ``errored`` history entry for its current entry into
# the state (the hash index on ``history.label`` finds it), or for labels errored before
# such entries were written, when the row last changed.
_RETRY_ERRORED = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_machines)s AS text[]), CAST(%(route_states)s AS text[]))
                 AS r(sm, state)
    ), errored AS (
        SELECT labels.shard_key, labels.state_machine, labels.name_key,
               COALESCE(
                   (SELECT max(history.created) FROM history
                    WHERE history.shard_key = labels.shard_key AND history.label = labels.name
                      AND history.state_machine = labels.state_machine
                      AND history.kind = 'errored' AND history.id > labels.entry_id),
                   labels.updated_at) AS errored_at
        FROM labels
        WHERE labels.errored AND NOT labels.deleted
          AND (labels.state_machine, labels.state) IN (SELECT sm, state FROM routes)
    ), retried AS (
        UPDATE labels SET errored = false, attempts = 0, due_at = %(now)s, lease_owner = NULL,
                          updated_at = %(now)s,
                          scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                              THEN %(now)s ELSE labels.scheduled_at END
        FROM errored
        WHERE labels.shard_key = errored.shard_key
          AND labels.state_machine = errored.state_machine
          AND labels.name_key = errored.name_key
          AND errored.errored_at >= %(since)s AND errored.errored_at < %(until)s
        RETURNING labels.shard_key, labels.state_machine, labels.name, labels.state,
                  labels.version
    ), versions AS (
        SELECT * FROM unnest(CAST(%(version_machines)s AS text[]),
                             CAST(%(runnings)s AS integer[]), CAST(%(continuings)s AS boolean[]))
                      AS v(sm, running, continuing)
    )
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, version, xact_id)
    SELECT retried.shard_key, retried.state_machine, retried.name, retried.state, retried.state,
           %(now)s, true, %(reason)s,
           CASE WHEN versions.continuing THEN COALESCE(retried.version, versions.running)
                ELSE versions.running END,
           pg_current_xact_id()
    FROM retried LEFT JOIN versions ON versions.sm = retried.state_machine
    """

# Labels due since before the cutoff, locked (skipping those another worker holds) until
# they are errored in the same transaction (routemaster.db.errored).
# ``shard_keys``: NULL on one server; on Citus every key of one shard (routemaster.db.shards).
_STALE = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_machines)s AS text[]), CAST(%(route_states)s AS text[]))
                 AS r(sm, state)
    )
    SELECT state_machine, name, entry_id FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND due_at < %(cutoff)s AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT sm, state FROM routes)
    ORDER BY due_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
    """

# On Citus (routemaster.db.shards): the shard keys of the oldest such labels, read without a
# lock across the shards (which shards to visit).
_STALE_KEYS = """
    WITH routes AS (
        SELECT * FROM unnest(CAST(%(route_machines)s AS text[]), CAST(%(route_states)s AS text[]))
                 AS r(sm, state)
    )
    SELECT shard_key FROM labels
    WHERE due_at < %(cutoff)s AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT sm, state FROM routes)
    ORDER BY due_at LIMIT %(batch)s
    """


def counts(
    conn: sa.Connection, routes: Sequence[Route], *, now: datetime.datetime
) -> dict[str, tuple[int, int]]:
    """Per receiver: (labels waiting for it, calls in flight to it)."""
    if not routes:
        return {}
    rows = fetch_all(conn, _COUNTS, {**route_arrays(routes), "now": now})
    return {receiver: (int(waiting), int(in_flight)) for receiver, waiting, in_flight in rows}


def retry_errored(
    conn: sa.Connection,
    states: Sequence[tuple[str, str]],
    *,
    since: datetime.datetime,
    until: datetime.datetime,
    now: datetime.datetime,
    reason: str,
) -> int:
    """Make due again every label errored in these states within [since, until): how many."""
    if not states:
        return 0
    machines = sorted({machine for machine, _ in states})
    params = {
        **_pairs(states),
        **version_arrays(conn, machines),
        "version_machines": machines,
        "since": since,
        "until": until,
        "now": now,
        "reason": reason,
    }
    count = run(conn, _RETRY_ERRORED, params)
    if count:
        notify_due(conn)
    return count


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
    params = {**_pairs(states), "cutoff": cutoff, "batch": batch, "shard_keys": None}
    shards = shard_map(conn)
    if shards is None:
        stale = fetch_all(conn, _STALE, params)
    else:
        stale = shards.take(conn, _STALE_KEYS, _STALE, params, limit="batch")
    erring = [Erring(machine, name, entry_id, reason) for machine, name, entry_id in stale]
    return len(become_errored(conn, erring, now=now))


def _pairs(states: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    return {"route_machines": [sm for sm, _ in states], "route_states": [s for _, s in states]}
