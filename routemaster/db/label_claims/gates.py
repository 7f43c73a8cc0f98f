"""Due gates claimed: locked for evaluation, leased when the evaluation must fetch feeds."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.catalogue import CLAIMABLE, IN_SHARD, NAMED_KEYS, RETURNED, named_by
from routemaster.db.claimed import Claim
from routemaster.db.keys import label_key_arrays
from routemaster.db.label_claims.states import IN_STATES, StateKey, state_arrays
from routemaster.db.labels import Label, label_from_row
from routemaster.db.shards import take
from routemaster.db.statements import fetch_all


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
    params = {"now": now, "limit": limit, **state_arrays(gate_states)}
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


# Due gates: claimable and in one of the (machine, state) pairs given as two arrays, read
# from labels_due. On Citus, first the shard keys of the oldest of them, read without a lock
# across the shards (which shards to visit).
_DUE_GATE = f"""due_at <= %(now)s AND {CLAIMABLE}
      AND {IN_STATES}"""

_LOCK_GATES = f"""
    SELECT {RETURNED}
    FROM labels
    WHERE {IN_SHARD}
      AND {_DUE_GATE}
    ORDER BY due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """

_DUE_GATE_KEYS = f"""
    SELECT shard_key FROM labels
    WHERE {_DUE_GATE}
    ORDER BY due_at
    LIMIT %(limit)s
    """

# Already locked gate labels leased, named with their shard keys.
_LEASE = f"""
    UPDATE labels SET due_at = %(lease_until)s, lease_owner = %(me)s,
                      attempts = labels.attempts + 1
    FROM unnest({NAMED_KEYS})
         AS leased(shard_key, sm, key, name)
    WHERE {named_by("leased")}
    RETURNING labels.state_machine, labels.name, labels.state, labels.metadata,
              labels.entry_id, labels.attempts, labels.version
    """
