"""How pull actions and their tasks show in explanations and the console."""

from __future__ import annotations

from typing import Any

from routemaster.api.responses import isoformat
from routemaster.app import App
from routemaster.config.model import Action
from routemaster.db import tasks as task_store
from routemaster.db.labels import Label


def action_explanation(app: App, action: Action, label: Label) -> dict[str, Any]:
    """An action's part of an explanation: where its work goes, and who holds it now.

    The task id is never shown: it is the capability to complete the task.
    """
    body: dict[str, Any] = {}
    if action.webhook is not None:
        body["webhook"] = action.webhook
    if action.worker is not None:
        body["worker"] = {"lease": int(action.worker.lease.total_seconds())}
    if action.async_timeout is not None:
        body["async_timeout"] = int(action.async_timeout.total_seconds())
    with app.db.connect() as conn:
        held = task_store.current(conn, label.state_machine, label.name, now=app.now())
    body["task"] = (
        None
        if held is None
        else {
            "worker": held.worker,
            "attempt": held.attempt,
            "claimed_at": isoformat(held.claimed_at),
            "lease_expires_at": isoformat(held.lease_expires_at),
        }
    )
    return body


def tasks_in_flight(app: App) -> dict[tuple[str, str], int]:
    """Tasks holding labels now, per (state machine, action state)."""
    with app.db.connect() as conn:
        return task_store.in_flight(conn, now=app.now())
