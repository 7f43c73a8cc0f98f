"""Evaluating due gates: in batches inside one short transaction, feeds apart.

Most gate conditions read only metadata and history, so a batch of due
labels is locked (``FOR UPDATE SKIP LOCKED``), evaluated in Python and moved
in one transaction: no HTTP, no lease needed. A label whose evaluation
reads a feed is leased instead and evaluated on its own by
:func:`evaluate_leased`, which fetches the feed with no transaction open.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from routemaster import labels
from routemaster.app import App
from routemaster.worker import claims
from routemaster.worker.claims import StateKey

logger = logging.getLogger(__name__)


def evaluate_due_gates(
    app: App, gate_states: Sequence[StateKey], *, limit: int
) -> tuple[int, list[StateKey]]:
    """Evaluate up to ``limit`` due gate labels; return how many, and those leased for feeds."""
    now = app.now()
    try:
        with app.db.begin() as conn:
            due = claims.lock_due_gates(conn, gate_states, limit=limit, now=now)
            outcome = labels.advance_batch_locked(conn, app, due)
            need_feeds = outcome.need_feeds
            claims.clear_due(conn, outcome.unmoved)
            claims.lease(
                conn,
                need_feeds,
                lease_until=now + app.settings.lease,
                worker_id=app.settings.worker_id,
            )
    except Exception:
        # One bad label must not stall the batch: redo it label by label.
        logger.exception("batch evaluation failed; evaluating one label at a time")
        return _evaluate_one_by_one(app, gate_states, limit=limit), []
    return len(due), need_feeds


def evaluate_leased(app: App, key: StateKey) -> None:
    """Evaluate one leased gate label, fetching feeds outside any transaction.

    A feed that fails leaves the label in its gate, due again after a short
    delay (see :func:`routemaster.labels.evaluate_label`).
    """
    try:
        machine = app.config.get_machine(key[0])
        labels.evaluate_label(app, machine, key[1], feed_timeout=app.settings.feed_timeout)
    except Exception as error:
        logger.exception("evaluating %s/%s failed", key[0], key[1])
        with app.db.begin() as conn:
            claims.record_evaluation_error(
                conn, key, due_at=app.now() + app.settings.lease, error=repr(error)
            )


def _evaluate_one_by_one(app: App, gate_states: Sequence[StateKey], *, limit: int) -> int:
    """The slow, isolated path after a batch failed: each label in its own transactions."""
    now = app.now()
    with app.db.begin() as conn:
        due = claims.lock_due_gates(conn, gate_states, limit=limit, now=now)
        keys = [(label.state_machine, label.name) for label in due]
        claims.lease(
            conn, keys, lease_until=now + app.settings.lease, worker_id=app.settings.worker_id
        )
    for key in keys:
        evaluate_leased(app, key)
    return len(keys)
