"""Delivering one claimed action webhook and recording what happened.

Runs in the worker's thread pool with no transaction open during the HTTP
call; the outcome is written afterwards only if the label is still in the
entry that was claimed (``entry_id``), so an operator's move in the
meantime wins. What the call came to goes to the delivery log and counts
for or against its receiver, in one service call
(:mod:`routemaster.service.delivery_outcomes`).
"""

from __future__ import annotations

import logging
import random
import time

from routemaster.app import App
from routemaster.config.model import Action
from routemaster.http.webhooks import Outcome, build_request, deliver
from routemaster.service.delivery_claims import Permit
from routemaster.service.delivery_outcomes import observe, record_failed_delivery, webhook_delivery
from routemaster.service.in_flight import Claim
from routemaster.service.versions import governing
from routemaster.worker import callbacks
from routemaster.worker.recording import Recorder

logger = logging.getLogger(__name__)


def deliver_claim(
    app: App, claim: Claim, rng: random.Random, permit: Permit, recorder: Recorder
) -> bool:
    """POST the claimed label's webhook; whether it was delivered.

    A failure is recorded here with its log entry (retry later, or errored; a
    failed probe goes back where it was in the queue, no attempt used); a
    success is left to the loop, which moves delivered labels on in batches
    (:func:`routemaster.service.batch_moves.complete_deliveries`) and writes
    their log entries in that transaction (from ``recorder``).
    """
    # The label's own version's definition (its webhook), on a continue machine.
    machine = governing(app, claim.state_machine, claim.version)
    action = machine.get_state(claim.state) if machine is not None else None
    if machine is None or not isinstance(action, Action):
        # A version this process cannot find, or one that lacks the state: the lease runs
        # out and a process that knows it takes the label.
        logger.warning("%s/%s: no definition here for its version", claim.state_machine, claim.name)
        return False
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
            started_at=app.now(),
        )
    app.hooks.webhook_called(
        state_machine=claim.state_machine,
        label=claim.name,
        url=request.url,
        status=result.status,
        duration=time.monotonic() - started,
    )
    assert result.call is not None
    entry = webhook_delivery(claim, permit, result.call)
    where = f"{claim.state_machine}/{claim.name} in {claim.state} (attempt {claim.attempts})"
    if callbacks.accepted_for_later(app, action, task_id, result, entry):
        logger.debug("%s accepted for later: waiting for task completion", where)
        return False
    observe(app, entry)
    if result.outcome is Outcome.DELIVERED:
        logger.debug("delivered %s: %s -> %s", where, request.url, result.status)
        recorder.delivered(claim, entry)
        return True
    record_failed_delivery(app, claim, permit, entry, result, policy=policy, rng=rng, where=where)
    recorder.failed()
    return False
