"""Work in flight: the claims the worker holds in its slots (deliveries, feed-reading
evaluations), kept leased while they run so that no other worker claims them again.

:class:`Claim` and :data:`StateKey` are the store's, named here for the worker (which never
imports the store).
"""

from __future__ import annotations

from collections.abc import Sequence

from routemaster.app import App
from routemaster.db import label_claims
from routemaster.db.claimed import Claim as Claim
from routemaster.db.label_claims import StateKey as StateKey
from routemaster.service.transactions import writing


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
