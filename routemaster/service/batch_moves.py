"""Moving labels on in batches: due gates, and actions whose webhooks were delivered.

Most conditions read only metadata and history, so a batch of labels is
locked, planned in Python and moved in one short transaction. A label whose
next evaluation reads a feed is leased instead and handed to a worker's slot,
which fetches the feed with no transaction open
(:func:`~routemaster.service.labels.advance_with_feeds`; a failure is
recorded by :func:`evaluation_failed`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from routemaster.app import App
from routemaster.db import deliveries, label_claims, receivers, schedules
from routemaster.db.claimed import Claim
from routemaster.db.deliveries import Delivery
from routemaster.db.label_claims import StateKey
from routemaster.db.labels import Label
from routemaster.service.labels import Settled, settle_batch
from routemaster.service.transactions import writing
from routemaster.service.versions import machine_for

Answered = Callable[[set[str], datetime.datetime], list[str]]
"""Of the receivers that answered, those whose rows need the success written."""

logger = logging.getLogger(__name__)


def evaluate_due_gates(
    app: App, gate_states: Sequence[StateKey], *, limit: int
) -> tuple[int, list[Claim]]:
    """Evaluate up to ``limit`` due gate labels: how many, and those leased to read feeds."""
    now = app.now()
    try:
        with writing(app) as conn:
            due = label_claims.lock_due_gates(conn, gate_states, limit=limit, now=now)
            settled = settle_batch(conn, app, due, now=now)
            schedules.settle_unmoved(conn, settled.unmoved)
            leased = _lease(conn, app, settled.waiting)
        _observe(app, due, settled, now)
        return len(due), leased
    except sa.exc.SQLAlchemyError:
        raise  # the database is away: the loop waits for it
    except Exception:
        # One bad label must not stall the batch: lease them all, evaluate each on its own.
        logger.exception("batch evaluation failed; evaluating one label at a time")
        app.hooks.exception("batch evaluation failed; evaluating one label at a time")
        with writing(app) as conn:
            due = label_claims.lock_due_gates(conn, gate_states, limit=limit, now=now)
            return len(due), _lease(conn, app, due)


def complete_deliveries(
    app: App,
    delivered: Sequence[Claim],
    entries: Sequence[Delivery] = (),
    answered: Answered | None = None,
) -> list[Claim]:
    """:func:`move_delivered` in a transaction of its own."""
    if not delivered:
        return []
    with writing(app) as conn:
        return move_delivered(conn, app, delivered, entries, answered)


def move_delivered(
    conn: sa.Connection,
    app: App,
    delivered: Sequence[Claim],
    entries: Sequence[Delivery] = (),
    answered: Answered | None = None,
) -> list[Claim]:
    """Move delivered labels on and write their calls' log ``entries``, all in ``conn``'s
    transaction (so the log never lags the labels); those leased to read feeds.

    Labels no longer in the delivered entry (an operator moved them) are left alone, and
    so are labels in a state this configuration lacks (renamed by a newer configuration
    during a rolling deploy): a worker running that one moves them on. ``answered``: see
    :func:`write_answered`.
    """
    if not delivered:
        return []
    locked = label_claims.lock_entries(conn, [claim.entry for claim in delivered])
    waiting = _settle(conn, app, [label for label in locked if _known(app, label)])
    write_answered(conn, entries, now=app.now(), answered=answered)
    return waiting


def evaluation_failed(app: App, claim: Claim, error: Exception) -> None:
    """A slot's evaluation of ``claim`` raised ``error``: the label is tried again later."""
    with writing(app) as conn:
        schedules.record_evaluation_failure(
            conn,
            claim.key,
            entry_id=claim.entry_id,
            error=repr(error),
            due_at=app.now() + app.settings.evaluation_retry_delay,
        )


def write_answered(
    conn: sa.Connection,
    entries: Sequence[Delivery],
    *,
    now: datetime.datetime,
    answered: Answered | None = None,
) -> None:
    """Write answered calls' entries and close their receivers' circuits, in ``conn``.

    ``answered`` picks the receivers whose rows need the success written
    (default: all of them).
    """
    if entries:
        deliveries.record(conn, entries)
        ids = {entry.receiver for entry in entries}
        receivers.succeeded(conn, answered(ids, now) if answered else sorted(ids), now=now)


def _known(app: App, label: Label) -> bool:
    """Whether the definition that governs the label (its version's) has its state."""
    try:
        machine = machine_for(app, label)
        return machine is not None and bool(machine.get_state(label.state))
    except KeyError:
        return False


def _observe(app: App, due: Sequence[Label], settled: Settled, now: datetime.datetime) -> None:
    """Per gate: labels evaluated, moved, and how late after their due time (SPEC E1)."""
    if app.metrics is None or not due:
        return
    stayed = {s.key for s in settled.unmoved} | {label.key for label in settled.waiting}
    by_gate: dict[StateKey, tuple[int, int, list[float]]] = {}
    for label in due:
        evaluated, moved, lags = by_gate.get((label.state_machine, label.state), (0, 0, []))
        if label.due_at is not None:
            lags.append((now - label.due_at).total_seconds())
        by_gate[(label.state_machine, label.state)] = (
            evaluated + 1,
            moved + (label.key not in stayed),
            lags,
        )
    for (machine, state), (evaluated, moved, lags) in by_gate.items():
        app.metrics.observe_gate_evaluations(
            machine, state, evaluated=evaluated, moved=moved, lags=lags
        )


def _settle(conn: sa.Connection, app: App, batch: Sequence[Label]) -> list[Claim]:
    settled = settle_batch(conn, app, batch, now=app.now())
    schedules.settle_unmoved(conn, settled.unmoved)
    return _lease(conn, app, settled.waiting)


def _lease(conn: sa.Connection, app: App, waiting: Sequence[Label]) -> list[Claim]:
    return label_claims.lease_gates(
        conn, waiting, lease_until=app.now() + app.settings.lease, worker_id=app.settings.worker_id
    )
