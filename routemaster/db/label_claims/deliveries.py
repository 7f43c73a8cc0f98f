"""Deliveries claimed by receiver: due labels in the states a receiver serves, oldest first,
each receiver up to what it may take now."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import CLAIMABLE, IN_SHARD, LABELS_IN_SHARD
from routemaster.db.claimed import Claim
from routemaster.db.receivers import Route, route_arrays
from routemaster.db.shards import FIND_KEYS, Fetch, ShardMap, take_each
from routemaster.db.statements import Row, fetch_all


@dataclass(frozen=True)
class Wanted:
    """Up to ``limit`` due labels for one receiver; ``counted``: the claim uses an attempt."""

    receiver: str
    limit: int
    counted: bool = True


@dataclass(frozen=True)
class ReceiverClaim:
    claim: Claim
    receiver: str
    was_due: datetime.datetime  # put back here if the call must not count
    last_error: str | None
    counted: bool  # False: a probe, which uses no attempt


def claim_deliveries(
    conn: sa.Connection,
    wanted: Sequence[Wanted],
    routes: Sequence[Route],
    *,
    free: int,
    now: datetime.datetime,
    lease_until: datetime.datetime,
    worker_id: str,
) -> list[ReceiverClaim]:
    """Lease up to ``free`` due labels, oldest first, at most each receiver's limit from it.

    The worker decides from the receivers' shared rows (:mod:`routemaster.db.receivers`)
    how many due labels each receiver may take now. When every receiver of ``routes``
    is wanted and none is limited below ``free`` (the common case), one plain scan of
    the due labels of all their routes does, as cheap to plan as it gets. Otherwise
    each route's due labels are read on their own (index ``labels_claimable``), so the
    labels of a receiver that may not be called (an open circuit, a pause, a rate) are
    never read at all.

    On Citus each shard's claim asks only for what the earlier shards left (free slots,
    each receiver's remaining number). When no receiver is limited below ``free``, the
    shards are those of one read of the oldest due deliveries of all wanted receivers;
    otherwise those of one read per receiver, up to its number, so that a receiver's old
    backlog it may not take (a rate, a probe) never hides the others' due labels.
    """
    wanted = [want for want in wanted if want.limit > 0]
    if free <= 0 or not wanted:
        return []
    lease = {"now": now, "lease_until": lease_until, "me": worker_id}

    def claim_in(
        fetch: Fetch, shard_keys: list[int] | None, taken: list[ReceiverClaim]
    ) -> list[ReceiverClaim]:
        still = _still_wanted(wanted, taken)
        room = free - len(taken)
        return _claim_deliveries(
            conn, fetch, still, routes, free=room, lease={**lease, "shard_keys": shard_keys}
        )

    def by_receiver(shards: ShardMap) -> list[list[int]]:
        keys: set[int] = set()
        for want in wanted:
            params = {
                **_plain_params([want], routes),
                "find_keys": max(min(want.limit, free), FIND_KEYS),
                **lease,
            }
            keys.update(key for (key,) in fetch_all(conn, _DUE_DELIVERY_KEYS, params))
        return shards.whole_shards(conn, keys)

    return take_each(
        conn,
        _DUE_DELIVERY_KEYS,
        {**_plain_params(wanted, routes), "find_keys": max(free, FIND_KEYS), **lease},
        claim_in,
        wanted=free,
        groups=None if _unlimited(wanted, free) else by_receiver,
        more=lambda taken: bool(_still_wanted(wanted, taken)),
        quiet=True,
    )


def _claim_deliveries(
    conn: sa.Connection,
    fetch: Fetch,
    wanted: Sequence[Wanted],
    routes: Sequence[Route],
    *,
    free: int,
    lease: dict[str, Any],
) -> list[ReceiverClaim]:
    """One claim statement (on Citus, a shard's: ``lease["shard_keys"]``)."""
    if _unlimited(wanted, free) and not _held(wanted, routes):
        params = {**_plain_params(wanted, routes), "free": free, **lease}
        return _plain_claims(fetch(conn, _CLAIM_DELIVERIES_PLAIN, params), routes)
    params = {**_wanted_params(wanted, routes), "free": free, **lease}
    return _limited_claims(fetch(conn, _CLAIM_DELIVERIES, params))


def _unlimited(wanted: Sequence[Wanted], free: int) -> bool:
    return all(want.counted and want.limit >= free for want in wanted)


def _held(wanted: Sequence[Wanted], routes: Sequence[Route]) -> bool:
    """Whether a receiver with routes is not wanted now (its labels must not be read)."""
    taking = {want.receiver for want in wanted}
    return any(receiver not in taking for receiver, _, _ in routes)


def _still_wanted(wanted: list[Wanted], taken: list[ReceiverClaim]) -> list[Wanted]:
    """What each receiver may still take after ``taken``."""
    left = []
    for want in wanted:
        limit = want.limit - sum(1 for item in taken if item.receiver == want.receiver)
        if limit > 0:
            left.append(replace(want, limit=limit))
    return left


def _plain_params(wanted: Sequence[Wanted], routes: Sequence[Route]) -> dict[str, Any]:
    taken = {want.receiver for want in wanted}
    pairs = [(sm, state) for receiver, sm, state in routes if receiver in taken]
    return {"route_machines": [sm for sm, _ in pairs], "route_states": [s for _, s in pairs]}


def _wanted_params(wanted: Sequence[Wanted], routes: Sequence[Route]) -> dict[str, Any]:
    return {
        "receivers": [want.receiver for want in wanted],
        "limits": [want.limit for want in wanted],
        "counted": [int(want.counted) for want in wanted],
        **route_arrays(routes),
    }


def _plain_claims(rows: list[Row], routes: Sequence[Route]) -> list[ReceiverClaim]:
    receiver_of = {(sm, state): receiver for receiver, sm, state in routes}
    return [_claimed(row, receiver_of[(row[0], row[2])], counted=True) for row in rows]


def _limited_claims(rows: list[Row]) -> list[ReceiverClaim]:
    # (label columns, receiver, was_due, last_error, counted, version): the receiver is the
    # claim's own
    return [_claimed(row[:6] + row[7:9] + row[10:11], row[6], counted=bool(row[9])) for row in rows]


def _claimed(row: Row, receiver: str, *, counted: bool) -> ReceiverClaim:
    """From (state_machine, name, state, metadata, entry_id, attempts, was_due, last_error,
    version)."""
    state_machine, name, state, metadata, entry_id, attempts, was_due, last_error, version = row
    return ReceiverClaim(
        Claim(state_machine, name, state, metadata, entry_id, attempts, version),
        receiver,
        was_due,
        last_error,
        counted,
    )


# Deliveries: per route of a wanted receiver, its oldest due labels up to the receiver's
# limit (each route's own LATERAL scan of labels_claimable, so a saturated or held
# receiver's backlog is never even read); then each receiver's oldest up to its limit, and
# the oldest of those up to the free slots. Rows locked but not chosen are released at
# commit, never leased. The plain form: one scan of every wanted route's due labels.
# ``shard_keys`` is named at each reference to labels, so that on Citus the whole statement
# is one shard's.
_CLAIM_DELIVERIES = f"""
    WITH wanted AS (
        SELECT * FROM unnest(CAST(%(receivers)s AS text[]), CAST(%(limits)s AS integer[]),
                             CAST(%(counted)s AS integer[])) AS w(receiver, lim, counted)
    ), routes AS (
        SELECT * FROM unnest(CAST(%(route_receivers)s AS text[]),
                             CAST(%(route_machines)s AS text[]),
                             CAST(%(route_states)s AS text[])) AS r(receiver, sm, state)
    ), due AS (
        SELECT picked.state_machine, picked.name_key, picked.due_at, wanted.receiver,
               wanted.lim, wanted.counted
        FROM wanted JOIN routes ON routes.receiver = wanted.receiver
        CROSS JOIN LATERAL (
            SELECT state_machine, name_key, due_at FROM labels
            WHERE {IN_SHARD}
              AND state_machine = routes.sm AND state = routes.state AND due_at IS NOT NULL
              -- due_at <= now, written so that only labels_claimable can bound it (labels_due
              -- would walk every due label of every state):
              AND (state, due_at) <= (routes.state, %(now)s)
              AND {CLAIMABLE}
            ORDER BY due_at
            LIMIT wanted.lim
            FOR UPDATE SKIP LOCKED
        ) AS picked
    ), ranked AS (
        SELECT due.*, row_number() OVER (PARTITION BY receiver ORDER BY due_at) AS n FROM due
    ), chosen AS (
        SELECT * FROM ranked WHERE n <= lim ORDER BY due_at LIMIT %(free)s
    )
    UPDATE labels SET due_at = %(lease_until)s, lease_owner = %(me)s,
                      attempts = labels.attempts + chosen.counted
    FROM chosen
    WHERE {LABELS_IN_SHARD}
      AND labels.state_machine = chosen.state_machine AND labels.name_key = chosen.name_key
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, chosen.receiver, chosen.due_at AS was_due,
              labels.last_error, chosen.counted, labels.version
    """

# The due deliveries of the wanted receivers' routes (the plain claim's, and on Citus their
# shard keys).
_DUE_DELIVERY = f"""due_at <= %(now)s AND {CLAIMABLE}
          AND (state_machine, state) IN (
              SELECT * FROM unnest(CAST(%(route_machines)s AS text[]),
                                   CAST(%(route_states)s AS text[])))"""

_CLAIM_DELIVERIES_PLAIN = f"""
    WITH due AS (
        SELECT state_machine, name_key, due_at FROM labels
        WHERE {IN_SHARD}
          AND {_DUE_DELIVERY}
        ORDER BY due_at
        LIMIT %(free)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE labels SET due_at = %(lease_until)s, lease_owner = %(me)s,
                      attempts = labels.attempts + 1
    FROM due
    WHERE {LABELS_IN_SHARD}
      AND labels.state_machine = due.state_machine AND labels.name_key = due.name_key
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, due.due_at AS was_due, labels.last_error,
              labels.version
    """

# On Citus: the shard keys of the oldest due deliveries of the wanted receivers (at least
# FIND_KEYS).
_DUE_DELIVERY_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_DUE_DELIVERY}
    ORDER BY due_at
    LIMIT %(find_keys)s
    """
