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

from collections.abc import Sequence

from routemaster.app import App
from routemaster.db import label_claims, occurrences
from routemaster.db.claimed import Claim as Claim  # for the worker
from routemaster.db.label_claims import StateKey as StateKey  # for the worker
from routemaster.db.notifications import Listener, due_listener
from routemaster.service.transactions import read, write, writing


def listen_for_due(app: App) -> Listener:
    """The worker's wake-ups: ``LISTEN`` on the direct URL when one is given, else on
    ``DATABASE_URL`` itself once a probe ``NOTIFY`` shows it works there (polled otherwise)."""
    metrics = app.metrics
    return due_listener(
        app.direct or app.db,
        app.db,
        on_change=None if metrics is None else metrics.listening("worker"),
    )


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


next_due_at = read(label_claims.next_due_at)
"""When the earliest live label falls due (leases running out included)."""


record_occurrence = write(occurrences.record_occurrence)
"""Whether this call is the first, across all workers, to handle the occurrence."""


forget_occurrences = write(occurrences.forget_occurrences)
"""Occurrences before ``before`` can never be computed again: their rows only take space."""
