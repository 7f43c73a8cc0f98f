"""The callback pattern: a webhook with ``async_timeout`` whose receiver answers 202 finishes later.

Before such a webhook is sent, the label gets a task id (the
``Routemaster-Task`` header), valid from that moment, so a completion that
arrives before the 202 counts. A 202 keeps the label leased for
``async_timeout``; the receiver completes, fails or heartbeats the task
through ``/tasks/{id}/...``. A lease that runs out brings the label back to
the worker, which sends the webhook again (a new task id); once that has
happened ``max_attempts`` times the label is errored. Any other 2xx moves the
label on, as without ``async_timeout``.
"""

from __future__ import annotations

import dataclasses
import logging

from routemaster.app import App
from routemaster.config.model import Action
from routemaster.http.webhooks import DeliveryResult, Outcome, WebhookRequest
from routemaster.service.delivery_outcomes import error_unanswered, hold_for_callback, observe
from routemaster.service.in_flight import Claim
from routemaster.service.reads import Delivery
from routemaster.service.tasks import open_callback_task

logger = logging.getLogger(__name__)

TASK_HEADER = "Routemaster-Task"


def open_callback(app: App, claim: Claim, action: Action, request: WebhookRequest) -> str | None:
    """With ``async_timeout``: the task id, put in the request's ``Routemaster-Task`` header."""
    if action.async_timeout is None:
        return None
    task_id = open_callback_task(
        app,
        claim.key,
        claim.entry_id,
        holder=app.settings.worker_id,
        timeout=action.async_timeout,
    )
    if task_id is not None:
        request.headers[TASK_HEADER] = task_id
    return task_id


def waited_too_often(app: App, claim: Claim, action: Action) -> bool:
    """A callback that never came ``max_attempts`` times: errored, nothing sent again."""
    if action.async_timeout is None or claim.attempts <= action.retry.max_attempts:
        return False
    error = f"no callback completed the task ({action.retry.max_attempts} attempts)"
    logger.warning("errored %s/%s in %s: %s", claim.state_machine, claim.name, claim.state, error)
    error_unanswered(app, claim, error)
    return True


def accepted_for_later(
    app: App, action: Action, task_id: str | None, result: DeliveryResult, entry: Delivery
) -> bool:
    """Whether the receiver took the work on for later (202): the label waits for the task.

    If so, the call's log entry (``accepted``) is written with the hold.
    """
    if task_id is None or action.async_timeout is None:
        return False
    if result.outcome is not Outcome.DELIVERED or result.status != 202:
        return False
    entry = dataclasses.replace(entry, outcome="accepted")  # a 202 that became a task
    hold_for_callback(app, task_id, entry, timeout=action.async_timeout)
    observe(app, entry)
    return True
