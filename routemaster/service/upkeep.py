"""Periodic upkeep of the delivery log and of receivers' waiting labels (the worker's steps).

Any number of workers may run these at once: each statement takes a bounded
batch (the log's oldest rows; waiting labels no other worker holds), so
concurrent runs share the work and none holds a lock for long.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from routemaster.app import App
from routemaster.config.origins import Receiver
from routemaster.db import deliveries, receiver_labels, receivers
from routemaster.service.transactions import reading, writing

logger = logging.getLogger(__name__)

PRUNE_BATCH = 1000
PRUNE_BATCHES = 20  # per run: at most this many rows x batches deleted each time
GIVE_UP_BATCH = 500


def prune_deliveries(app: App) -> int:
    """Delete deliveries older than the retention, a bounded amount per run: how many."""
    cutoff = app.now() - app.settings.delivery_retention
    total = 0
    for _ in range(PRUNE_BATCHES):
        with writing(app) as conn:
            deleted = deliveries.prune(conn, cutoff=cutoff, batch=PRUNE_BATCH)
        total += deleted
        if deleted < PRUNE_BATCH:
            break
    if total:
        logger.info("pruned %d deliveries older than %s", total, cutoff.isoformat())
    return total


def give_up_on_open_receivers(app: App, known: Mapping[str, Receiver]) -> int:
    """Error the labels that have waited on an open circuit longer than its ``give_up_after``.

    ``known``: the receivers the worker calls, by id.
    """
    now = app.now()
    with reading(app) as conn:
        rows = receivers.some(conn, [r.id for r in known.values() if r.action_states])
    total = 0
    for row in rows:
        if row.circuit == "closed" or row.paused:
            continue
        receiver = known[row.id]
        give_up_after = receiver.policy.circuit.give_up_after
        reason = (
            f"receiver {receiver.origin} unavailable (circuit {row.circuit}) for longer than "
            f"give_up_after ({give_up_after}); last error: {row.last_error}"
        )
        with writing(app) as conn:
            count = receiver_labels.give_up(
                conn,
                receiver.action_states,
                cutoff=now - give_up_after,
                now=now,
                reason=reason,
                batch=GIVE_UP_BATCH,
            )
        if count:
            logger.warning("errored %d labels waiting on %s: %s", count, receiver.origin, reason)
        total += count
    return total
