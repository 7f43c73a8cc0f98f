"""Delivering one claimed action webhook and recording what happened.

Runs in the worker's thread pool with no transaction open during the HTTP
call; the outcome is written afterwards only if the label is still in the
entry that was claimed (``entry_id``), so an operator's move in the
meantime wins.
"""

from __future__ import annotations

import logging
import random
import time

from routemaster.app import App
from routemaster.config.model import Action
from routemaster.db import claims
from routemaster.db.claims import Claim
from routemaster.http.webhooks import Outcome, build_request, deliver
from routemaster.worker import callbacks
from routemaster.worker.retry import backoff

logger = logging.getLogger(__name__)


def deliver_claim(app: App, claim: Claim, rng: random.Random) -> bool:
    """POST the claimed label's webhook; whether it was delivered.

    A failure is recorded here (retry later, or errored); a success is left to
    the loop, which moves delivered labels on in batches
    (:func:`routemaster.worker.evaluation.complete_deliveries`).
    """
    machine = app.config.get_machine(claim.state_machine)
    action = machine.get_state(claim.state)
    assert isinstance(action, Action), "claims only ever select labels in action states"
    policy = action.retry  # the machine's policy with the action's overrides, from the loader
    if callbacks.waited_too_often(app, claim, action):
        return False
    request = build_request(
        machine,
        action,
        claim.name,
        claim.metadata,
        token=str(claim.entry_id),
        timestamp=int(app.now().timestamp()),
    )
    task_id = callbacks.open_callback(app, claim, action, request)  # with async_timeout
    started = time.monotonic()
    with app.hooks.webhook(machine, action) as log_response:
        result = deliver(
            app.http,
            request,
            timeout=policy.timeout.total_seconds(),
            max_response_bytes=app.settings.max_response_body,
            on_response=log_response,
        )
    app.hooks.webhook_called(
        state_machine=claim.state_machine,
        label=claim.name,
        url=request.url,
        status=result.status,
        duration=time.monotonic() - started,
    )
    where = f"{claim.state_machine}/{claim.name} in {claim.state} (attempt {claim.attempts})"
    if callbacks.accepted_for_later(app, action, task_id, result):
        logger.debug("%s accepted for later: waiting for task completion", where)
        return False
    if result.outcome is Outcome.DELIVERED:
        logger.debug("delivered %s: %s -> %s", where, request.url, result.status)
        return True
    assert result.error is not None
    if result.outcome is Outcome.GONE or claim.attempts >= policy.max_attempts:
        error = f"{result.error} (attempt {claim.attempts} of {policy.max_attempts})"
        logger.warning("errored %s: %s", where, error)
        with app.db.begin() as conn:
            claims.record_errored(conn, claim, error=error)
        return False
    delay = backoff(policy, claim.attempts, rng)
    logger.info("retrying %s in %.1fs: %s", where, delay.total_seconds(), result.error)
    with app.db.begin() as conn:
        claims.record_retry(
            conn,
            claim,
            due_at=app.now() + delay,
            error=result.error,
            worker_id=app.settings.worker_id,
        )
    return False
