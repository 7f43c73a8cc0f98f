"""What a claimed label's webhook call came to, written with what it did to the label.

The worker's slot makes the call with no transaction open and decides
nothing about the store; each outcome is one service call here, one
transaction: a failed call's log entry with its retry, its errored mark or
its probe put back (:func:`record_failed_delivery`); a 202 that became a
task with the task's hold (:func:`hold_for_callback`); a callback that never
came too often (:func:`error_unanswered`). A delivered call's entry is
written when the loop moves its label on
(:func:`~routemaster.service.batch_moves.move_delivered`).
"""

from __future__ import annotations

import datetime
import logging
import random

from routemaster.app import App
from routemaster.config.model import RetryPolicy
from routemaster.db import deliveries, label_claims, receivers
from routemaster.db import tasks as task_store
from routemaster.db.claimed import Claim
from routemaster.db.deliveries import Delivery
from routemaster.db.transitions import mark_errored
from routemaster.http.calls import Call
from routemaster.http.webhooks import DeliveryResult, Outcome
from routemaster.machine.retry import backoff
from routemaster.service.batch_moves import write_answered
from routemaster.service.delivery_claims import Permit
from routemaster.service.transactions import writing

logger = logging.getLogger(__name__)


def webhook_delivery(claim: Claim, permit: Permit, call: Call) -> Delivery:
    """The log entry of one webhook call for a claimed label."""
    return deliveries.entry_for(
        call,
        kind="webhook",
        receiver=permit.receiver.id,
        trigger=permit.trigger,
        attempt=claim.attempts + 1 if permit.probe else claim.attempts,
        state_machine=claim.state_machine,
        label=claim.name,
        state=claim.state,
    )


def observe(app: App, delivery: Delivery) -> None:
    """Count the call in the process's metrics (per receiver, kind and outcome)."""
    if app.metrics is not None:
        app.metrics.observe_call(delivery)


def error_unanswered(app: App, claim: Claim, error: str) -> None:
    """Error a label whose callback never came: an errored history entry and event, as any
    errored webhook."""
    with writing(app) as conn:
        mark_errored(conn, claim, error=error, now=app.now())


def hold_for_callback(
    app: App, task_id: str, entry: Delivery, *, timeout: datetime.timedelta
) -> None:
    """A 202 that became a task: hold the label for ``timeout``, and write the call's entry."""
    now = app.now()
    with writing(app) as conn:
        task_store.hold_for_callback(conn, task_id, until=now + timeout)
        write_answered(conn, [entry], now=now)


def record_failed_delivery(
    app: App,
    claim: Claim,
    permit: Permit,
    entry: Delivery,
    result: DeliveryResult,
    *,
    policy: RetryPolicy,
    rng: random.Random,
    where: str,
) -> None:
    """Write a failed call's entry, count it for or against its receiver, and decide the
    label: errored (gone, or its last attempt), its probe put back where it was in the
    queue (no attempt used), or retried after the backoff (or ``Retry-After``, if longer).

    ``where`` names the label in the log lines. An error is written first, before the
    entry and the receiver's row: it is the transaction's first write, so the label's
    other writers are serialised before the transaction takes its id (docs/architecture.md,
    "Order within one label").
    """
    call, error = result.call, result.error
    assert call is not None and error is not None
    now = app.now()
    circuit = permit.receiver.policy.circuit
    retry_after = call.retry_after
    failure = receivers.Failure(
        receiver=permit.receiver.id,
        at=now,
        error=error,
        counted=call.receiver_failed,
        probe=permit.probe and call.receiver_failed,
        threshold=circuit.failures,
        reopen_at=now + circuit.cooldown,
        retry_until=None if retry_after is None else now + retry_after,
    )
    gives_up = result.outcome is Outcome.GONE or (
        not permit.probe and claim.attempts >= policy.max_attempts
    )
    with writing(app) as conn:
        if gives_up:  # the label first: its error is the transaction's first write
            errored = f"{error} (attempt {claim.attempts} of {policy.max_attempts})"
            logger.warning("errored %s: %s", where, errored)
            mark_errored(conn, claim, error=errored, now=now)
        deliveries.record(conn, [entry])
        if call.receiver_failed:
            receivers.failed(conn, failure)
        else:  # it answered: the receiver is up, whatever it thought of this label
            receivers.succeeded(conn, [permit.receiver.id], now=now)
        if gives_up:
            return
        if permit.probe:
            logger.info("probe of %s failed: %s", permit.receiver.origin, error)
            # back where it was in the queue; a probe used no attempt, so none is given back
            unsent = label_claims.Unsent(claim, permit.was_due, counted=False)
            label_claims.put_back(conn, [unsent], worker_id=app.settings.worker_id)
        else:
            delay = backoff(policy, claim.attempts, rng)
            if retry_after is not None:
                delay = max(delay, retry_after)
            logger.info("retrying %s in %.1fs: %s", where, delay.total_seconds(), error)
            label_claims.record_retry(
                conn,
                claim,
                due_at=now + delay,
                error=error,
                worker_id=app.settings.worker_id,
            )
