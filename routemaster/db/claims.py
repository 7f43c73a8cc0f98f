"""The worker's due work: claiming it, leasing it, and recording what came of it.

A label is due when ``due_at <= now``. Claiming pushes ``due_at`` one lease
into the future and names the worker in ``lease_owner``, in one short
transaction committed before any HTTP; the worker renews the lease while the
work is in flight, and if the worker dies the lease runs out and the label is
due again. Rows are picked with ``FOR UPDATE SKIP LOCKED`` so concurrent
workers never take the same label: in one statement on one server, shard by
shard on Citus (each claim's two forms side by side here;
:mod:`routemaster.db.shards` says why).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.labels import Label, LabelKey, label_from_row
from routemaster.db.shards import shard_map, take
from routemaster.db.statements import Row, fetch_all, fetch_one, run

StateKey = tuple[str, str]
"""(state machine, state)."""


@dataclass(frozen=True)
class Claim:
    """One leased piece of work, in one shape from the claim to its outcome."""

    state_machine: str
    name: str
    state: str
    metadata: dict[str, Any]
    entry_id: int
    attempts: int  # including this one
    version: int | None = None  # the label's own (routemaster.machine.versions)

    @property
    def key(self) -> LabelKey:
        return (self.state_machine, self.name)

    @property
    def entry(self) -> tuple[str, str, int]:
        return (self.state_machine, self.name, self.entry_id)


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
    params = {"now": now, "limit": limit, "shard_keys": None, **_states(gate_states)}
    rows = take(conn, _DUE_GATE_KEYS, _LOCK_GATES, params)
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
        return [label_from_row(row) for row in fetch_all(conn, _LOCK_ENTRIES, _entries(entries))]
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


def mark_gate_due(
    conn: sa.Connection,
    state_machine: str,
    state: str,
    *,
    now: datetime.datetime,
    zone_path: Sequence[str] | None = None,
    zone: str | None = None,
) -> int:
    """Make every label in the gate due now (only those whose metadata names ``zone``, if given).

    One set-based statement, so the number of labels costs the database work
    but never worker memory. Labels leased to a worker are being processed
    and are left alone. Paused labels are marked too: the evaluation is owed
    to them when they are resumed.
    """
    params: dict[str, Any] = {"sm": state_machine, "state": state, "now": now}
    if zone_path is None:
        return run(conn, _MARK_GATE_DUE, params)
    params.update(path=list(zone_path), zone=zone)
    return run(conn, _MARK_GATE_DUE_IN_ZONE, params)


def zones_in_gate(
    conn: sa.Connection, state_machine: str, state: str, path: Sequence[str]
) -> list[str]:
    """The distinct values at metadata ``path`` among labels in the gate."""
    params = {"sm": state_machine, "state": state, "path": list(path)}
    rows = fetch_all(conn, _ZONES_IN_GATE, params)
    return [row[0] for row in rows]


def next_due_at(conn: sa.Connection) -> datetime.datetime | None:
    """When the earliest live label falls due (leases expiring included)."""
    row = fetch_one(conn, _NEXT_DUE)
    return None if row is None else row[0]


def _states(pairs: Sequence[StateKey]) -> dict[str, list[str]]:
    return {"machines": [machine for machine, _ in pairs], "states": [state for _, state in pairs]}


# Claimable: due, live, and in one of the (machine, state) pairs given as two arrays; read
# from the labels_due index, which holds only labels that can be claimed (migration 0019).
# ``shard_keys``: NULL on one server (the test folds away when the statement is planned); on
# Citus every key of one shard, so that the statement is that shard's alone (a router
# statement, where SKIP LOCKED holds: routemaster.db.shards).

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

# On Citus: the shard keys of the oldest due gate labels, read without a lock across the
# shards (which shards to visit).
_DUE_GATE_KEYS = """
    SELECT shard_key FROM labels
    WHERE due_at <= %(now)s AND NOT deleted AND NOT paused AND NOT errored
      AND (state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))
    ORDER BY due_at
    LIMIT %(limit)s
    """

# The labels are named with their shard keys (all of them on one server; one shard's on
# Citus, in shard order), found by primary key.
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

# Leases taken, renewed and given back name every label with its shard key, so that on
# Citus each statement reaches only the shards of its labels.

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


# A gate's labels that a clock trigger makes due: not deleted or errored, not leased to a
# worker, and not due already.

_MARK_GATE_DUE = """
    UPDATE labels SET due_at = %(now)s
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted AND NOT errored
      AND lease_owner IS NULL AND (due_at IS NULL OR due_at > %(now)s)
    """

_MARK_GATE_DUE_IN_ZONE = """
    UPDATE labels SET due_at = %(now)s
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted AND NOT errored
      AND lease_owner IS NULL AND (due_at IS NULL OR due_at > %(now)s)
      AND metadata #>> CAST(%(path)s AS text[]) = %(zone)s
    """

_ZONES_IN_GATE = """
    SELECT DISTINCT metadata #>> CAST(%(path)s AS text[]) FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted
      AND metadata #>> CAST(%(path)s AS text[]) IS NOT NULL
    """

# From the labels_due index, which holds only labels that can be claimed (migration 0019).
_NEXT_DUE = """
    SELECT min(due_at) FROM labels
    WHERE due_at IS NOT NULL AND NOT deleted AND NOT paused AND NOT errored
    """
