"""Receivers: ``GET /receivers``, pausing and resuming one, retrying the labels it errored.

What a receiver is and how its shared row is kept: :mod:`routemaster.service.receivers`.
"""

from __future__ import annotations

import datetime

import flask

from routemaster.api.deliveries import parse_time
from routemaster.auth import OPERATE, READ
from routemaster.service import receivers
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.request_checks import checked_body
from routemaster.webcore.responses import json_response, receivers_json

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
    return _set_receiver_paused(receiver, paused=True)


@blueprint.post(RECEIVER + "/resume")
@endpoint(
    OPERATE,
    "Resume a paused receiver",
    REPLIES,
    tags=("receivers",),
)
def resume(receiver: str) -> flask.Response:
    return _set_receiver_paused(receiver, paused=False)


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


def _set_receiver_paused(ident: str, *, paused: bool) -> flask.Response:
    """Pause or resume a receiver (404 if unknown); it as ``GET /receivers`` shows it."""
    app = routemaster_app()
    known = receivers.set_receiver_paused(app, ident, paused=paused)
    return json_response(next(entry for entry in receivers_json(app) if entry["id"] == known.id))
