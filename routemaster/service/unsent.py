"""Work claimed but never started, given back because the worker is stopping.

SIGTERM may come while a claim is under way (its statement waiting on a lock,
say) or between a claim and its slot: that work is not sent. It is due again
at once, in its old place in the queue (a delivery's due time from before its
claim, a gate evaluation now), its attempt given back and its lease released,
and idle workers are woken (``NOTIFY``) so another one takes it now rather
than when the lease would have run out. A probe given back lets the
receiver's next worker probe at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from routemaster.app import App
from routemaster.db import label_claims, receivers
from routemaster.db.claimed import Claim
from routemaster.db.label_claims import Unsent
from routemaster.db.notifications import notify_due
from routemaster.service.delivery_claims import Permit
from routemaster.service.transactions import writing

logger = logging.getLogger(__name__)


def put_back(
    app: App,
    *,
    deliveries: Sequence[tuple[Claim, Permit]] = (),
    gates: Sequence[Claim] = (),
) -> None:
    """Give back unsent ``deliveries`` and gate evaluations (``gates``) in one transaction."""
    if not deliveries and not gates:
        return
    now = app.now()
    unsent = [
        Unsent(claim, min(permit.was_due, now), counted=not permit.probe)
        for claim, permit in deliveries
    ]
    unsent.extend(Unsent(claim, now, counted=True) for claim in gates)
    probed = sorted({permit.receiver.id for _, permit in deliveries if permit.probe})
    with writing(app) as conn:
        count = label_claims.put_back(conn, unsent, worker_id=app.settings.worker_id)
        for receiver in probed:
            receivers.no_probe(conn, receiver, now=now)
        notify_due(conn)
    logger.info("stopping: gave back %d claimed labels not sent", count)
