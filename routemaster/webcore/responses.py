"""JSON responses, and the JSON both web faces show of the service's read models.

Responses are written with :mod:`json` directly: no content negotiation, no
key sorting. The shapes here are the schemas of :mod:`routemaster.webcore.schemas`
(a delivery, a receiver, a subscription, a past task, an explanation): the
API answers them, the console's pages show the same.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from flask import Response

from routemaster.app import App
from routemaster.service import Label, receivers
from routemaster.service import tasks as task_service
from routemaster.service.reads import Delivery
from routemaster.service.receivers import Receiver, ReceiverRow
from routemaster.service.subscriptions import Shown

# What json.dumps(separators=(",", ":"), ensure_ascii=False) builds on every call; it holds
# only those two settings, so one serves every response.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# As mimetype="application/json" would make it, minus Werkzeug working that out per response.
_CONTENT_TYPE = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_ENCODE(body), status=status, headers=headers, content_type=_CONTENT_TYPE)


def isoformat(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def explanation_json(explanation: dict[str, Any]) -> dict[str, Any]:
    """An explanation (:func:`routemaster.service.explanations.explanation_of`) as JSON."""
    rendered: dict[str, Any] = _jsonable(explanation)
    return rendered


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, Delivery):
        return delivery_json(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def delivery_json(delivery: Delivery) -> dict[str, Any]:
    return {
        "id": delivery.id,
        "kind": delivery.kind,
        "state_machine": delivery.state_machine,
        "label": delivery.label,
        "state": delivery.state,
        "url": delivery.url,
        "receiver": delivery.receiver,
        "attempt": delivery.attempt,
        "trigger": delivery.trigger,
        "started_at": isoformat(delivery.started_at),
        "duration_ms": delivery.duration_ms,
        "status": delivery.status,
        "outcome": delivery.outcome,
        "error": delivery.error,
        "response_excerpt": delivery.response_excerpt,
    }


def past_tasks(app: App, label: Label, *, limit: int) -> list[dict[str, Any]]:
    """The label's latest tasks, oldest first, without their ids."""
    found = task_service.tasks_of_label(app, *label.key, limit=limit)
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


def receivers_json(app: App) -> list[dict[str, Any]]:
    """Every receiver the configuration reaches, and any other with a row, by id."""
    return [_receiver_json(*status) for status in receivers.receiver_statuses(app)]


def _receiver_json(
    ident: str, known: Receiver | None, row: ReceiverRow | None, counts: tuple[int, int]
) -> dict[str, Any]:
    waiting, in_flight = counts
    policy = known.policy if known is not None else None
    return {
        "id": ident,
        "origin": known.origin if known is not None else row.origin if row else ident,
        "state": row.state if row is not None else "closed",
        "in_flight": in_flight,
        "waiting": waiting,
        "failures_in_a_row": row.failures_in_a_row if row is not None else 0,
        "last_success_at": isoformat(row.last_success_at) if row is not None else None,
        "last_failure_at": isoformat(row.last_failure_at) if row is not None else None,
        "last_error": row.last_error if row is not None else None,
        "open_until": isoformat(row.open_until) if row is not None else None,
        "max_in_flight": policy.max_in_flight if policy is not None else None,
        "rate": str(policy.rate) if policy is not None and policy.rate is not None else None,
    }


def subscription_json(entry: Shown) -> dict[str, Any]:
    """A subscription as the API shows it: settings, cursor, lag, the batch in flight."""
    subscription, lag = entry
    in_flight = None
    if subscription.batch_id is not None:
        in_flight = {
            "webhook_id": subscription.batch_id,
            "events": subscription.batch_events,
            "last_id": str(subscription.batch_last),
        }
    return {
        "name": subscription.name,
        "url": subscription.url,
        "state_machines": (
            list(subscription.state_machines) if subscription.state_machines is not None else None
        ),
        "max_events": subscription.max_events,
        "batch_delay_ms": subscription.batch_delay_ms,
        "signing_secret_env": subscription.signing_secret_env,
        "cursor": str(subscription.acknowledged),
        "pending": lag.pending,
        "oldest_pending_at": isoformat(lag.oldest_pending_at),
        "in_flight": in_flight,
        "next_attempt_at": isoformat(subscription.due_at) if in_flight else None,
        "last_attempt_at": isoformat(subscription.last_attempt_at),
        "last_success_at": isoformat(subscription.last_success_at),
        "last_error": subscription.last_error,
        "failures_in_a_row": subscription.failures_in_a_row,
        "lost_events": subscription.lost_events,
        "created_at": isoformat(subscription.created_at),
        "updated_at": isoformat(subscription.updated_at),
    }
