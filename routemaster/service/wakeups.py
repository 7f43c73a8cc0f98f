"""When the worker wakes: between rounds it sleeps until the next label falls due, or until a
``NOTIFY`` says one has. On Citus, what the worker's quiet claims must know to send no
statement while nothing is due (:mod:`routemaster.db.idle_shards`)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from routemaster.app import App
from routemaster.db import label_claims
from routemaster.db.notifications import Listener, due_listener
from routemaster.db.shards import known_shard_map
from routemaster.service.transactions import read


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
