"""The worker's claims of due work: their leases, when the next falls due, clock occurrences.

The worker holds claims (deliveries, feed-reading evaluations) in its
slots; while they are in flight their leases are extended so no other
worker claims them again, and between rounds it sleeps until the next label
falls due or a ``NOTIFY`` says one has (:func:`listen_for_due`). A clock
trigger's occurrence is claimed too: the first worker to record it fires it
for the others' logs and metrics. Each reads or writes the store in a
transaction of its own.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from routemaster.app import App
from routemaster.db import label_claims, occurrences
from routemaster.db.claimed import Claim as Claim  # for the worker
from routemaster.db.label_claims import StateKey as StateKey  # for the worker
from routemaster.db.notifications import Listener, due_listener
from routemaster.db.shards import known_shard_map
from routemaster.service.transactions import read, write, writing


def listen_for_due(app: App) -> Listener:
    """The worker's wake-ups: ``LISTEN`` on the direct URL when one is given, else on
    ``DATABASE_URL`` itself once a probe ``NOTIFY`` shows it works there (polled otherwise)."""
    metrics = app.metrics
    return due_listener(
        app.direct or app.db,
        app.db,
        on_change=None if metrics is None else metrics.listening("worker"),
        later=True,
    )


def tell_idle_shards(
    app: App, *, listening: bool, payloads: Sequence[str] = (), busy: bool = False
) -> None:
    """On Citus, what the worker's quiet claims (:mod:`routemaster.db.idle_shards`) must know:
    whether its ``LISTEN`` works, the due notifications it heard, and whether its round found
    work (its own writes set due times). Nothing on one server; never a statement."""
    shards = known_shard_map(app.db)
    if shards is None:
        return
    shards.idle.hearing(listening)
    if busy:
        shards.idle.wake()
    shards.idle.heard(payloads)


def extend_leases(app: App, held: Sequence[Claim]) -> None:
    """Keep every claim in ``held`` leased for one more lease from now."""
    if not held:
        return
    with writing(app) as conn:
        label_claims.extend_leases(
            conn,
            held,
            lease_until=app.now() + app.settings.lease,
            worker_id=app.settings.worker_id,
        )


_read_next_due_at = read(label_claims.next_due_at)


def next_due_at(app: App) -> datetime.datetime | None:
    """When the earliest live label falls due (leases running out included); on Citus, while
    the worker's claims are quiet, the one kept (no statement) when it covers them."""
    shards = known_shard_map(app.db)
    if shards is not None:
        kept, at = shards.idle.kept_next_due()
        if kept:
            return at
    return _read_next_due_at(app)


record_occurrence = write(occurrences.record_occurrence)
"""Whether this call is the first, across all workers, to handle the occurrence."""


forget_occurrences = write(occurrences.forget_occurrences)
"""Occurrences before ``before`` can never be computed again: their rows only take space."""
