"""A slot's evaluation of one leased label, reading its feeds over HTTP.

Due gates are moved on in batches by the service
(:mod:`routemaster.service.batch_moves`); a label whose next evaluation reads
a feed is leased and handed to a slot, which runs :func:`evaluate_claim`
with no transaction open.
"""

from __future__ import annotations

import logging

from routemaster import service
from routemaster.app import App
from routemaster.service.batch_moves import evaluation_failed
from routemaster.service.in_flight import Claim

logger = logging.getLogger(__name__)


def evaluate_claim(app: App, claim: Claim) -> bool:
    """A slot's job: evaluate one leased label, reading its feeds over HTTP."""
    try:
        service.advance_with_feeds(
            app, claim.key, claim.entry_id, timeout=app.settings.feed_timeout
        )
    except Exception as error:
        logger.exception("evaluating %s/%s failed", claim.state_machine, claim.name)
        app.hooks.exception(f"evaluating {claim.state_machine}/{claim.name} failed")
        evaluation_failed(app, claim, error)
    return False
