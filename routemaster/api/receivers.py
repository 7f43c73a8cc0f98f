"""Receivers: ``GET /receivers``, pausing and resuming one, retrying the labels it errored.

What a receiver is and how its shared row is kept: :mod:`routemaster.service.receivers`.
"""

from __future__ import annotations

import datetime
from typing import Any

import flask

from routemaster.api.deliveries import parse_time
from routemaster.app import App
from routemaster.auth import OPERATE, READ
from routemaster.service import receivers
from routemaster.service.receivers import Receiver, ReceiverRow
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.responses import isoformat, json_response
from routemaster.webcore.validation import checked_body

blueprint = flask.Blueprint("receivers", __name__)

RECEIVER = "/receivers/<name:receiver>"
REPLIES = {200: Reply("Receiver"), 404: Reply("Error")}


@blueprint.get("/receivers")
@endpoint(
    READ,
    "Every receiver: its circuit, calls in flight, labels waiting",
    {200: Reply("ReceiverList")},
    tags=("receivers",),
)
def list_receivers() -> flask.Response:
    app = routemaster_app()
    return json_response({"receivers": receivers_json(app)})


@blueprint.post(RECEIVER + "/pause")
@endpoint(
    OPERATE,
    "Pause a receiver: its deliveries wait (no attempts used) until it is resumed",
    REPLIES,
    tags=("receivers",),
)
def pause(receiver: str) -> flask.Response:
    return _set_paused(receiver, paused=True)


@blueprint.post(RECEIVER + "/resume")
@endpoint(
    OPERATE,
    "Resume a paused receiver",
    REPLIES,
    tags=("receivers",),
)
def resume(receiver: str) -> flask.Response:
    return _set_paused(receiver, paused=False)


@blueprint.post(RECEIVER + "/retry-errored")
@endpoint(
    OPERATE,
    "Retry every label errored against this receiver within a time window",
    {200: Reply("RetryCount"), 400: Reply("Error"), 404: Reply("Error")},
    body="RetryErrored",
    tags=("receivers",),
)
def retry_errored(receiver: str) -> flask.Response:
    """``{"since", "until"?}``: labels that became errored in [since, until) are due again."""
    app = routemaster_app()
    known = receivers.known_receiver(app, receiver)
    body = checked_body()
    since = parse_time(body["since"])
    assert since is not None
    now = app.now()
    until = parse_time(body.get("until")) or now + datetime.timedelta(seconds=1)
    reason = body.get("reason") or f"retry-errored for receiver {known.id}"
    count = receivers.retry_errored(app, known, since=since, until=until, now=now, reason=reason)
    return json_response({"count": count})


def receivers_json(app: App) -> list[dict[str, Any]]:
    """Every receiver the configuration reaches, and any other with a row, by id."""
    return [_receiver_json(*status) for status in receivers.receiver_statuses(app)]


def _set_paused(ident: str, *, paused: bool) -> flask.Response:
    return json_response(set_paused(routemaster_app(), ident, paused=paused))


def set_paused(app: App, ident: str, *, paused: bool) -> dict[str, Any]:
    """Pause or resume a receiver (404 if unknown); it as ``GET /receivers`` shows it."""
    known = receivers.set_paused(app, ident, paused=paused)
    return next(entry for entry in receivers_json(app) if entry["id"] == known.id)


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
