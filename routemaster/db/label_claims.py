"""Claims of labels: due gates, deliveries by receiver and pull tasks, their leases, run-out
leases, and the sweeps that pick labels for upkeep.

Every claim here follows three rules, stated once:

- **Claimable** means ``due_at <= now AND NOT deleted AND NOT paused AND
  NOT errored``: the predicate of the partial indexes ``labels_due`` and
  ``labels_claimable`` (migration 0019), which hold only labels that can be
  claimed. Each statement names it whole, so that PostgreSQL may read those
  indexes (``tests/db/test_label_claims.py`` checks that each does); paused
  or errored overdue labels then cost a claim nothing.
- **Picked** with ``FOR UPDATE SKIP LOCKED``, so concurrent workers never
  take the same label: one statement on one server; on Citus the same
  statement on one shard at a time, its ``%(shard_keys)s`` every key of the
  shard (NULL on one server), through :func:`routemaster.db.shards.take` or
  :func:`~routemaster.db.shards.take_each`, which say why.
- **Leased** in the lease columns, in one short transaction committed before
  any HTTP: ``due_at`` one lease ahead, ``lease_owner`` the worker,
  ``attempts`` counted. The worker renews the lease while the work is in
  flight (only while ``lease_owner`` is still its own); if the worker dies
  the lease runs out and the label is due again. Leases taken, renewed and
  given back name every label with its shard key, so that on Citus each
  statement reaches only the shards of its labels.

Sweeps (ended pauses, labels never scheduled, labels a receiver has not
answered for too long) pick labels the same way but lease nothing: the labels
stay locked only for the transaction that acts on them. Where picking and
acting are one statement (retention's deletes, a configuration's renames),
the statement is the transition's, in :mod:`routemaster.db.transitions`.

What a claim hands out is a :class:`~routemaster.db.claimed.Claim`. A pull
claim also gives each lease a task id, recorded in ``tasks``; what is then
done by task id is :mod:`routemaster.db.tasks`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from routemaster.db.claimed import Claim
from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.labels import Label, label_from_row, serialises
from routemaster.db.receivers import Route, route_arrays
from routemaster.db.shards import Fetch, ShardMap, shard_map, take, take_each
from routemaster.db.statements import Row, fetch_all, fetch_one, run
from routemaster.db.tasks import Held, LeasedState, Task

StateKey = tuple[str, str]
"""(state machine, state)."""


# --- due gates ---------------------------------------------------------------------------


def lock_due_gates(
    conn: sa.Connection, gate_states: Sequence[StateKey], *, limit: int, now: datetime.datetime
) -> list[Label]:
    """Lock up to ``limit`` due labels in ``gate_states``, for evaluation in ``conn``.

    Only states this worker's configuration knows are taken, so during a
    rolling deploy an old worker never mistakes a new state for something
    with nothing to do.
    """
    if limit <= 0 or not gate_states:
        return []
    params = {"now": now, "limit": limit, **_states(gate_states)}
    rows = take(conn, _DUE_GATE_KEYS, _LOCK_GATES, params, quiet=True)
    return [label_from_row(row) for row in rows]


def lease_gates(
    conn: sa.Connection, labels: Sequence[Label], *, lease_until: datetime.datetime, worker_id: str
) -> list[Claim]:
    """Lease already-locked gate labels whose evaluation must fetch feeds over HTTP."""
    if not labels:
        return []
    rows = fetch_all(
        conn,
        _LEASE,
        {
            "lease_until": lease_until,
            "me": worker_id,
            **label_key_arrays(label.key for label in labels),
        },
    )
    return [Claim(*row) for row in rows]


# --- deliveries by receiver --------------------------------------------------------------


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
            params = {**_plain_params([want], routes), "free": min(want.limit, free), **lease}
            keys.update(key for (key,) in fetch_all(conn, _DUE_DELIVERY_KEYS, params))
        return shards.whole_shards(conn, keys)

    return take_each(
        conn,
        _DUE_DELIVERY_KEYS,
        {**_plain_params(wanted, routes), "free": free, **lease},
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


# --- pull tasks --------------------------------------------------------------------------


def claim_tasks(
    conn: sa.Connection,
    states: Sequence[LeasedState],
    *,
    ids: Sequence[str],
    worker: str,
    now: datetime.datetime,
) -> list[Task]:
    """Lease up to ``len(ids)`` due labels in pull actions ``states``, oldest due first, one
    id each (on Citus, each shard given the ids the earlier shards left)."""
    if not states or not ids:
        return []
    params = {
        "machines": [machine for machine, _, _ in states],
        "states": [state for _, state, _ in states],
        "leases": [lease.seconds for _, _, lease in states],
        # Computed here: Citus refuses a STABLE function (timestamptz + interval) of a
        # column in an UPDATE.
        "lease_untils": [now + datetime.timedelta(seconds=lease.seconds) for _, _, lease in states],
        "sources": [lease.source for _, _, lease in states],
        "samples": [lease.samples for _, _, lease in states],
        "ids": list(ids),
        "limit": len(ids),
        "worker": worker,
        "now": now,
    }

    def claim_in(fetch: Fetch, shard_keys: list[int] | None, taken: list[Task]) -> list[Task]:
        left = list(ids[len(taken) :])
        taking = {**params, "ids": left, "limit": len(left), "shard_keys": shard_keys}
        return [Task(*row) for row in fetch(conn, _CLAIM_TASKS, taking)]

    return take_each(conn, _AWAITING_KEYS, params, claim_in, wanted=len(ids))


def lock_expired_tasks(
    conn: sa.Connection, states: Sequence[StateKey], *, now: datetime.datetime, limit: int
) -> list[Held]:
    """Lock up to ``limit`` labels in pull actions ``states`` whose lease has run out."""
    if not states:
        return []
    params = {"now": now, "limit": limit, **_states(states)}
    rows = take(conn, _EXPIRED_KEYS, _LOCK_EXPIRED, params, quiet=True)
    return [Held(*row) for row in rows]


# --- leases ------------------------------------------------------------------------------


def extend_leases(
    conn: sa.Connection,
    claims: Iterable[Claim],
    *,
    lease_until: datetime.datetime,
    worker_id: str,
) -> None:
    """Keep work that is still in flight from being claimed again by another worker."""
    claims = list(claims)
    if claims:
        run(
            conn,
            _EXTEND_LEASES,
            {
                "lease_until": lease_until,
                "me": worker_id,
                **label_key_arrays(claim.key for claim in claims),
                "entries": [claim.entry_id for claim in claims],
            },
        )


def record_retry(
    conn: sa.Connection, claim: Claim, *, due_at: datetime.datetime, error: str, worker_id: str
) -> bool:
    """A failed attempt: due again at ``due_at``, unless the label moved or was re-claimed."""
    updated = run(
        conn,
        _RECORD_RETRY,
        {
            "sm": claim.state_machine,
            "name": claim.name,
            "key": label_key(claim.name),
            "entry_id": claim.entry_id,
            "due_at": due_at,
            "error": error,
            "me": worker_id,
        },
    )
    return updated == 1


@dataclass(frozen=True)
class Unsent:
    """A claim given back unsent (the worker is stopping): due at ``due_at``, its attempt not
    used (``counted``: the claim had counted one)."""

    claim: Claim
    due_at: datetime.datetime
    counted: bool


def put_back(conn: sa.Connection, unsent: Sequence[Unsent], *, worker_id: str) -> int:
    """Release claims never sent: due again, the attempt given back, no lease; how many.

    Only rows still leased to ``worker_id`` in the claimed entry change.
    """
    if not unsent:
        return 0
    params = {
        **label_key_arrays(item.claim.key for item in unsent),
        "entries": [item.claim.entry_id for item in unsent],
        "due_ats": [item.due_at for item in unsent],
        "counted": [int(item.counted) for item in unsent],
        "me": worker_id,
    }
    return run(conn, _PUT_BACK, params)


def lock_entries(conn: sa.Connection, entries: Sequence[tuple[str, str, int]]) -> list[Label]:
    """Lock the live labels still in the given entries, (machine, name, entry_id) each."""
    if not entries:
        return []
    shards = shard_map(conn)
    if shards is None:
        statement = _SERIALISED_LOCK_ENTRIES if serialises(conn, len(entries)) else _LOCK_ENTRIES
        found = fetch_all(conn, statement, _entries(entries))
        return [label_from_row(row) for row in found]
    # On Citus one router statement per shard (routemaster.db.shards), in shard order.
    rows: list[Row] = []
    for group in shards.groups(conn, {shard_key(name) for _, name, _ in entries}, ordered=True):
        keys = set(group)
        some = [entry for entry in entries if shard_key(entry[1]) in keys]
        rows += shards.fetch_all(conn, _LOCK_ENTRIES, _entries(some))
    return [label_from_row(row) for row in rows]


def _entries(entries: Sequence[tuple[str, str, int]]) -> dict[str, list[Any]]:
    return {
        **label_key_arrays((machine, name) for machine, name, _ in entries),
        "entries": [entry_id for _, _, entry_id in entries],
    }


def next_due_at(conn: sa.Connection) -> datetime.datetime | None:
    """When the earliest live label falls due (leases expiring included).

    On Citus, while a worker's claims are quiet (:mod:`~routemaster.db.idle_shards`): the
    earliest due time or end of a pause after they found nothing, read across the shards
    only when the one kept does not cover them.
    """
    shards = shard_map(conn)
    if shards is not None:
        quiet, at = shards.idle.next_due(lambda since: _next_due_since(conn, since))
        if quiet:
            return at
    row = fetch_one(conn, _NEXT_DUE)
    return None if row is None else row[0]


def _next_due_since(conn: sa.Connection, since: datetime.datetime) -> datetime.datetime | None:
    row = fetch_one(conn, _NEXT_DUE_SINCE, {"since": since})
    return None if row is None else row[0]


# --- sweeps: labels picked for upkeep, locked for one transaction, never leased ----------


def lock_ended(conn: sa.Connection, *, now: datetime.datetime, limit: int) -> list[Label]:
    """Lock up to ``limit`` paused labels whose pause has ended."""
    params = {"now": now, "limit": limit, "shard_keys": None}
    rows = take(conn, _ENDED_KEYS, _LOCK_ENDED, params, quiet=True)
    return [label_from_row(row) for row in rows]


def lock_unscheduled(
    conn: sa.Connection, states: Sequence[tuple[str, str]], *, limit: int
) -> list[Label]:
    """Up to ``limit`` live rows in ``states`` written since their schedule was computed.

    Found through the partial index ``labels_unscheduled``, so the cost is
    that of the rows returned, never of the table. The ``ORDER BY`` of the
    index's columns is what makes PostgreSQL walk it: it cannot estimate how
    few rows the index's condition holds and would otherwise read the table
    (217 ms at a million labels, every few seconds).
    """
    if limit <= 0 or not states:
        return []
    params = {
        "machines": [machine for machine, _ in states],
        "states": [state for _, state in states],
        "limit": limit,
        "shard_keys": None,
    }
    rows = take(conn, _UNSCHEDULED_KEYS, _LOCK_UNSCHEDULED, params, quiet=True)
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


def _states(pairs: Sequence[StateKey]) -> dict[str, list[str]]:
    return {"machines": [machine for machine, _ in pairs], "states": [state for _, state in pairs]}


# Due gates: claimable and in one of the (machine, state) pairs given as two arrays, read
# from labels_due. On Citus, first the shard keys of the oldest of them, read without a lock
# across the shards (which shards to visit).

_LOCK_GATES = """
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND due_at <= %(now)s AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

_DUE_GATE_KEYS = """
    SELECT shard_key FROM labels
    WHERE due_at <= %(now)s AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    """

# Deliveries: per route of a wanted receiver, its oldest due labels up to the receiver's
# limit (each route's own LATERAL scan of labels_claimable, so a saturated or held
# receiver's backlog is never even read); then each receiver's oldest up to its limit, and
# the oldest of those up to the free slots. Rows locked but not chosen are released at
# commit, never leased. The plain form: one scan of every wanted route's due labels.
# ``shard_keys`` is named at each reference to labels, so that on Citus the whole statement
# is one shard's.
_CLAIM_DELIVERIES = """
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
            WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
                   OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
              AND state_machine = routes.sm AND state = routes.state AND due_at IS NOT NULL
              -- due_at <= now, written so that only labels_claimable can bound it (labels_due
              -- would walk every due label of every state):
              AND (state, due_at) <= (routes.state, %(now)s)
              AND NOT deleted AND NOT paused AND NOT errored
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
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND labels.state_machine = chosen.state_machine AND labels.name_key = chosen.name_key
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, chosen.receiver, chosen.due_at AS was_due,
              labels.last_error, chosen.counted, labels.version
    """

_CLAIM_DELIVERIES_PLAIN = """
    WITH due AS (
        SELECT state_machine, name_key, due_at FROM labels
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND due_at <= %(now)s AND NOT deleted AND NOT paused AND NOT errored
          AND (state_machine, state) IN (
              SELECT * FROM unnest(CAST(%(route_machines)s AS text[]),
                                   CAST(%(route_states)s AS text[])))
        ORDER BY due_at
        LIMIT %(free)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE labels SET due_at = %(lease_until)s, lease_owner = %(me)s,
                      attempts = labels.attempts + 1
    FROM due
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND labels.state_machine = due.state_machine AND labels.name_key = due.name_key
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, due.due_at AS was_due, labels.last_error,
              labels.version
    """

# On Citus: the shard keys of the oldest due deliveries of the wanted receivers.
_DUE_DELIVERY_KEYS = """
    SELECT shard_key FROM labels
    WHERE due_at <= %(now)s AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (
          SELECT * FROM unnest(CAST(%(route_machines)s AS text[]),
                               CAST(%(route_states)s AS text[])))
    ORDER BY due_at
    LIMIT %(free)s
    """

# Pull tasks: the pull actions come as arrays (machines, states, their leases in seconds
# and when they end, where each lease came from: recorded in tasks for explanations). Each
# state's oldest due labels come from labels_claimable (so a claim costs the same however
# long the backlog), then the oldest of those are taken; the ids are numbered in that
# order, so each label gets one.
_CLAIM_TASKS = """
    WITH pulled AS (
        SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[]),
                             CAST(%(leases)s AS double precision[]),
                             CAST(%(sources)s AS text[]), CAST(%(samples)s AS integer[]),
                             CAST(%(lease_untils)s AS timestamptz[]))
                      AS p(state_machine, state, lease, lease_source, lease_samples, lease_until)
    ), candidates AS (
        SELECT waiting.*, pulled.lease, pulled.lease_source, pulled.lease_samples,
               pulled.lease_until
        FROM pulled CROSS JOIN LATERAL (
            SELECT labels.state_machine, labels.name_key, labels.due_at FROM labels
            WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
                   OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
              AND labels.state_machine = pulled.state_machine AND labels.state = pulled.state
              AND labels.due_at IS NOT NULL
              -- due_at <= now, written so that only labels_claimable can bound it (labels_due
              -- would walk every due label of every state):
              AND (labels.state, labels.due_at) <= (pulled.state, %(now)s)
              AND labels.lease_owner IS NULL
              AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
            ORDER BY labels.due_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS waiting
    ), due AS (
        SELECT * FROM candidates ORDER BY due_at LIMIT %(limit)s
    ), numbered AS (
        SELECT due.*, row_number() OVER (ORDER BY due.due_at) AS n FROM due
    ), ids AS (
        SELECT * FROM unnest(CAST(%(ids)s AS text[])) WITH ORDINALITY AS i(id, n)
    ), claimed AS (
        UPDATE labels SET due_at = numbered.lease_until,
                          lease_owner = %(worker)s,
                          task_id = CAST(labels.shard_key AS text) || '.' || ids.id,
                          attempts = labels.attempts + 1
        FROM numbered JOIN ids ON ids.n = numbered.n
        WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
               OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
          AND labels.state_machine = numbered.state_machine
          AND labels.name_key = numbered.name_key
        RETURNING labels.task_id, labels.state_machine, labels.name, labels.state,
                  labels.metadata, labels.attempts, labels.entry_id, labels.due_at,
                  numbered.lease, numbered.lease_source, numbered.lease_samples, numbered.n,
                  labels.shard_key
    ), issued AS (
        INSERT INTO tasks (id, shard_key, state_machine, label, state, entry_id, attempt, worker,
                           lease, claimed_at, lease_source, lease_samples)
        SELECT task_id, shard_key, state_machine, name, state, entry_id, attempts, %(worker)s,
               lease * interval '1 second', %(now)s, lease_source, lease_samples
        FROM claimed
    )
    SELECT task_id AS id, state_machine, name AS label, state, metadata, attempts AS attempt,
           entry_id, due_at AS lease_expires_at
    FROM claimed ORDER BY n
    """

# On Citus: the shard keys of the oldest labels awaiting a pull claim.
_AWAITING_KEYS = """
    SELECT labels.shard_key FROM labels
    WHERE (labels.state_machine, labels.state) IN (
              SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[])))
      AND labels.due_at <= %(now)s AND labels.lease_owner IS NULL
      AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
    ORDER BY labels.due_at
    LIMIT %(limit)s
    """

# Run-out pull leases (leased labels, index labels_leased), and on Citus their shard keys.
_LOCK_EXPIRED = """
    SELECT state_machine, name, state, task_id, attempts, entry_id FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND due_at <= %(now)s AND lease_owner IS NOT NULL AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

_EXPIRED_KEYS = """
    SELECT shard_key FROM labels
    WHERE due_at <= %(now)s AND lease_owner IS NOT NULL AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    """

# The labels of given entries, named with their shard keys (all of them on one server; one
# shard's on Citus, in shard order), found by primary key.
_LOCK_ENTRIES = """
    SELECT labels.state_machine, labels.name, labels.metadata, labels.state,
           labels.state_entered_at, labels.entry_id, labels.previous_state, labels.deleted,
           labels.paused, labels.errored, labels.last_error, labels.attempts, labels.due_at,
           labels.created_at, labels.updated_at, labels.version
    FROM labels JOIN unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                            CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                            CAST(%(entries)s AS bigint[]))
                     AS wanted(shard_key, sm, key, name, entry_id)
      ON labels.state_machine = wanted.sm AND labels.name_key = wanted.key
         AND labels.shard_key = wanted.shard_key
         AND labels.name = wanted.name AND labels.entry_id = wanted.entry_id
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
    ORDER BY labels.state_machine, labels.name_key
    FOR UPDATE OF labels
    """

# On one server, _LOCK_ENTRIES once the labels' writers are serialised (the advisory lock of
# routemaster/db/labels.py): every label's, in one order, before any row lock (the first row
# lock takes the transaction's id).
_SERIALISED_LOCK_ENTRIES = """
    SELECT labels.state_machine, labels.name, labels.metadata, labels.state,
           labels.state_entered_at, labels.entry_id, labels.previous_state, labels.deleted,
           labels.paused, labels.errored, labels.last_error, labels.attempts, labels.due_at,
           labels.created_at, labels.updated_at, labels.version
    FROM labels JOIN unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                            CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                            CAST(%(entries)s AS bigint[]))
                     AS wanted(shard_key, sm, key, name, entry_id)
      ON labels.state_machine = wanted.sm AND labels.name_key = wanted.key
         AND labels.shard_key = wanted.shard_key
         AND labels.name = wanted.name AND labels.entry_id = wanted.entry_id
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND NOT labels.deleted AND NOT labels.paused AND NOT labels.errored
      AND (SELECT count(pg_advisory_xact_lock(in_order.sm_hash, in_order.name_hash))
           FROM (SELECT DISTINCT hashtext(w.sm) AS sm_hash, hashtext(w.name) AS name_hash
                 FROM unnest(CAST(%(machines)s AS text[]), CAST(%(names)s AS text[]))
                      AS w(sm, name)
                 ORDER BY sm_hash, name_hash OFFSET 0) AS in_order) IS NOT NULL
    ORDER BY labels.state_machine, labels.name_key
    FOR UPDATE OF labels
    """

# Leases taken (already locked gate labels), renewed, recorded as a retry, given back.

_LEASE = """
    UPDATE labels SET due_at = %(lease_until)s, lease_owner = %(me)s,
                      attempts = labels.attempts + 1
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]))
         AS leased(shard_key, sm, key, name)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = leased.shard_key AND labels.state_machine = leased.sm
      AND labels.name_key = leased.key AND labels.name = leased.name
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, labels.version
    """

_EXTEND_LEASES = """
    UPDATE labels SET due_at = %(lease_until)s
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                CAST(%(entries)s AS bigint[]))
         AS held(shard_key, sm, key, name, entry_id)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = held.shard_key AND labels.state_machine = held.sm
      AND labels.name_key = held.key AND labels.name = held.name
      AND labels.entry_id = held.entry_id AND labels.lease_owner = %(me)s
    """

_RECORD_RETRY = """
    UPDATE labels SET due_at = %(due_at)s, last_error = %(error)s, lease_owner = NULL
    WHERE state_machine = %(sm)s AND name_key = %(key)s AND name = %(name)s
      AND entry_id = %(entry_id)s AND lease_owner = %(me)s AND NOT deleted AND NOT errored
    """

_PUT_BACK = """
    UPDATE labels SET due_at = back.due_at, lease_owner = NULL,
                      attempts = GREATEST(labels.attempts - back.counted, 0)
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[]),
                CAST(%(entries)s AS bigint[]), CAST(%(due_ats)s AS timestamptz[]),
                CAST(%(counted)s AS integer[]))
         AS back(shard_key, sm, key, name, entry_id, due_at, counted)
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND labels.shard_key = back.shard_key AND labels.state_machine = back.sm
      AND labels.name_key = back.key AND labels.name = back.name
      AND labels.entry_id = back.entry_id
      AND labels.lease_owner = %(me)s AND NOT labels.deleted AND NOT labels.errored
    """

# From labels_due (the earliest claimable label, a lease running out included).
_NEXT_DUE = """
    SELECT min(due_at) FROM labels
    WHERE due_at IS NOT NULL AND NOT deleted AND NOT paused AND NOT errored
    """

# On Citus, for quiet claims (routemaster.db.idle_shards): the first due time or pause's end
# after ``since`` (each subquery one read across the shards, from labels_due and
# labels_paused_until).
_NEXT_DUE_SINCE = """
    SELECT LEAST(
        (SELECT min(due_at) FROM labels
         WHERE due_at > %(since)s AND NOT deleted AND NOT paused AND NOT errored),
        (SELECT min(paused_until) FROM labels
         WHERE paused_until > %(since)s AND paused AND NOT deleted))
    """

# ``shard_keys``: NULL on one server; on Citus every key of one shard (routemaster.db.shards).
_LOCK_ENDED = """
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND paused_until <= %(now)s AND paused AND NOT deleted
    ORDER BY paused_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

# On Citus (routemaster.db.shards): the shard keys of the oldest ended pauses, read without a
# lock across the shards (which shards to visit).
_ENDED_KEYS = """
    SELECT shard_key FROM labels
    WHERE paused_until <= %(now)s AND paused AND NOT deleted
    ORDER BY paused_until
    LIMIT %(limit)s
    """

# ``shard_keys``: NULL on one server; on Citus every key of one shard (routemaster.db.shards).
_LOCK_UNSCHEDULED = """
    SELECT state_machine, name, metadata, state, state_entered_at, entry_id, previous_state,
           deleted, paused, errored, last_error, attempts, due_at, created_at, updated_at,
           version
    FROM labels
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND NOT deleted AND scheduled_at IS DISTINCT FROM updated_at AND lease_owner IS NULL
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY state_machine, state
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

# On Citus (routemaster.db.shards): the shard keys of such rows, read without a lock across
# the shards (which shards to visit).
_UNSCHEDULED_KEYS = """
    SELECT shard_key FROM labels
    WHERE NOT deleted AND scheduled_at IS DISTINCT FROM updated_at AND lease_owner IS NULL
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY state_machine, state
    LIMIT %(limit)s
    """

# Labels due since before the cutoff, locked (skipping those another worker holds) until
# they are errored in the same transaction (routemaster.db.transitions).
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
