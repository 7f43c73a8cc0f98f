"""How pull actions, their tasks and pauses with an end show in explanations and the console."""

from __future__ import annotations

import datetime
from typing import Any

from routemaster.app import App
from routemaster.config.graph import worker_settings
from routemaster.config.model import Action
from routemaster.service import Label
from routemaster.service import tasks as task_service
from routemaster.webcore.responses import isoformat


def action_explanation(app: App, action: Action, label: Label) -> dict[str, Any]:
    """An action's part of an explanation: where its work goes, and who holds it now.

    The task id is never shown: it is the capability to complete the task.
    """
    body: dict[str, Any] = {}
    if action.webhook is not None:
        body["webhook"] = action.webhook
    if action.worker is not None:
        body["worker"] = worker_settings(action.worker)
    if action.async_timeout is not None:
        body["async_timeout"] = int(action.async_timeout.total_seconds())
    held = task_service.current_task(app, label)
    body["task"] = (
        None
        if held is None
        else {
            "worker": held.worker,
            "attempt": held.attempt,
            "claimed_at": isoformat(held.claimed_at),
            "lease_expires_at": isoformat(held.lease_expires_at),
            "lease": {
                "seconds": held.lease.total_seconds(),
                "source": held.lease_source or "fixed",
                "samples": held.lease_samples or 0,
            },
        }
    )
    return body


def paused_until(app: App, label: Label) -> datetime.datetime | None:
    """When a paused label resumes by itself (``None``: when an operator resumes it)."""
    return task_service.paused_until(app, label)


def past_tasks(app: App, label: Label, *, limit: int) -> list[dict[str, Any]]:
    """The label's latest tasks, oldest first, without their ids."""
    found = task_service.tasks_of_label(app, label, limit=limit)
    return [
        {
            "state": task.state,
            "attempt": task.attempt,
            "worker": task.worker,
            "idempotency_token": str(task.entry_id),
            "claimed_at": isoformat(task.claimed_at),
            "ended_at": isoformat(task.ended_at),
            "outcome": task.outcome,
        }
        for task in found
    ]


def tasks_in_flight(app: App) -> dict[tuple[str, str], int]:
    """Tasks holding labels now, per (state machine, action state)."""
    return task_service.tasks_in_flight(app)
