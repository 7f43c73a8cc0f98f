"""Claims of labels: due gates, deliveries by receiver and pull tasks, their leases, run-out
leases, and the sweeps that pick labels for upkeep.

One module a kind of claim: :mod:`.gates` (due gates), :mod:`.deliveries` (by receiver),
:mod:`.pulls` (pull tasks, run-out pull leases), :mod:`.leases` (leases renewed, given back,
locked again) and :mod:`.sweeps` (upkeep); every name is importable from here. The pieces
their statements share are :mod:`routemaster.db.catalogue`'s.

Every claim here follows three rules, stated once:

- **Claimable** means ``due_at <= now AND NOT deleted AND NOT paused AND
  NOT errored``: the predicate of the partial indexes ``labels_due`` and
  ``labels_claimable`` (migration 0019), which hold only labels that can be
  claimed. Each statement names it whole (:data:`~routemaster.db.catalogue.CLAIMABLE`),
  so that PostgreSQL may read those indexes (``tests/db/test_label_claims.py`` checks
  that each does); paused or errored overdue labels then cost a claim nothing.
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

from routemaster.db.label_claims.deliveries import ReceiverClaim, Wanted, claim_deliveries
from routemaster.db.label_claims.gates import lease_gates, lock_due_gates
from routemaster.db.label_claims.leases import (
    Unsent,
    extend_leases,
    lock_entries,
    next_due_at,
    put_back,
    record_retry,
)
from routemaster.db.label_claims.pulls import claim_tasks, lock_expired_tasks
from routemaster.db.label_claims.states import StateKey
from routemaster.db.label_claims.sweeps import lock_ended, lock_stale, lock_unscheduled

__all__ = [
    "ReceiverClaim",
    "StateKey",
    "Unsent",
    "Wanted",
    "claim_deliveries",
    "claim_tasks",
    "extend_leases",
    "lease_gates",
    "lock_due_gates",
    "lock_ended",
    "lock_entries",
    "lock_expired_tasks",
    "lock_stale",
    "lock_unscheduled",
    "next_due_at",
    "put_back",
    "record_retry",
]
