"""The worker's claims of due work: keeping their leases, and when the next work falls due.

The worker holds claims (deliveries, feed-reading evaluations) in its
slots; while they are in flight their leases are extended so no other
worker claims them again, and between rounds it sleeps until the next label
falls due. Both read or write the store in a transaction of their own.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from routemaster.app import App
from routemaster.db import claims
from routemaster.db.claims import Claim


def extend_leases(app: App, held: Sequence[Claim]) -> None:
    """Keep every claim in ``held`` leased for one more lease from now."""
    if not held:
        return
    with app.db.begin() as conn:
        claims.extend_leases(
            conn,
            held,
            lease_until=app.now() + app.settings.lease,
            worker_id=app.settings.worker_id,
        )


def next_due_at(app: App) -> datetime.datetime | None:
    """When the earliest live label falls due (leases running out included)."""
    with app.db.connect() as conn:
        return claims.next_due_at(conn)
