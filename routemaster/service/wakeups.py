"""When the worker wakes: between rounds it sleeps until the next label falls due, or until a
``NOTIFY`` says one has."""

from __future__ import annotations

from routemaster.app import App
from routemaster.db import label_claims
from routemaster.db.notifications import Listener, due_listener
from routemaster.service.transactions import read


def listen_for_due(app: App) -> Listener:
    """The worker's wake-ups: ``LISTEN`` on the direct URL when one is given, else on
    ``DATABASE_URL`` itself once a probe ``NOTIFY`` shows it works there (polled otherwise)."""
    metrics = app.metrics
    return due_listener(
        app.direct or app.db,
        app.db,
        on_change=None if metrics is None else metrics.listening("worker"),
    )


next_due_at = read(label_claims.next_due_at)
"""When the earliest live label falls due (leases running out included)."""
