"""Leases held by the worker: renewed, recorded as a retry, given back unsent; the labels of
delivered entries locked again; and when the next label falls due."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import (
    CLAIMABLE,
    EACH_LABEL,
    LABELS_CLAIMABLE,
    NAMED_KEYS,
    RETURNED_FROM_LABELS,
    named_by,
    serialised,
)
from routemaster.db.claimed import Claim
from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.labels import Label, label_from_row, serialises
from routemaster.db.shards import shard_map
from routemaster.db.statements import Row, fetch_all, fetch_one, run


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
    """When the earliest live label falls due (leases expiring included)."""
    row = fetch_one(conn, _NEXT_DUE)
    return None if row is None else row[0]


# The labels of given entries, named with their shard keys (all of them on one server; one
# shard's on Citus, in shard order), found by primary key.
_LOCK_ENTRIES = f"""
    SELECT {RETURNED_FROM_LABELS}
    FROM labels JOIN unnest({NAMED_KEYS},
                            CAST(%(entries)s AS bigint[]))
                     AS wanted(shard_key, sm, key, name, entry_id)
      ON labels.state_machine = wanted.sm AND labels.name_key = wanted.key
         AND labels.shard_key = wanted.shard_key
         AND labels.name = wanted.name AND labels.entry_id = wanted.entry_id
    WHERE labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND {LABELS_CLAIMABLE}
    ORDER BY labels.state_machine, labels.name_key
    FOR UPDATE OF labels
    """

# On one server, _LOCK_ENTRIES once the labels' writers are serialised (the advisory lock of
# routemaster/db/labels.py): every label's, in one order, before any row lock (the first row
# lock takes the transaction's id).
_SERIALISED_LOCK_ENTRIES = serialised(_LOCK_ENTRIES, EACH_LABEL)

# Leases renewed, recorded as a retry, given back.

_EXTEND_LEASES = f"""
    UPDATE labels SET due_at = %(lease_until)s
    FROM unnest({NAMED_KEYS},
                CAST(%(entries)s AS bigint[]))
         AS held(shard_key, sm, key, name, entry_id)
    WHERE {named_by("held")}
      AND labels.entry_id = held.entry_id AND labels.lease_owner = %(me)s
    """

_RECORD_RETRY = """
    UPDATE labels SET due_at = %(due_at)s, last_error = %(error)s, lease_owner = NULL
    WHERE state_machine = %(sm)s AND name_key = %(key)s AND name = %(name)s
      AND entry_id = %(entry_id)s AND lease_owner = %(me)s AND NOT deleted AND NOT errored
    """

_PUT_BACK = f"""
    UPDATE labels SET due_at = back.due_at, lease_owner = NULL,
                      attempts = GREATEST(labels.attempts - back.counted, 0)
    FROM unnest({NAMED_KEYS},
                CAST(%(entries)s AS bigint[]), CAST(%(due_ats)s AS timestamptz[]),
                CAST(%(counted)s AS integer[]))
         AS back(shard_key, sm, key, name, entry_id, due_at, counted)
    WHERE {named_by("back")}
      AND labels.entry_id = back.entry_id
      AND labels.lease_owner = %(me)s AND NOT labels.deleted AND NOT labels.errored
    """

# From labels_due (the earliest claimable label, a lease running out included).
_NEXT_DUE = f"""
    SELECT min(due_at) FROM labels
    WHERE due_at IS NOT NULL AND {CLAIMABLE}
    """
