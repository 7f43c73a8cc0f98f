"""Operator commands: retry an errored label, pause and resume it, move it by force.

Clients can still never move a label; these are for the people running the
service (put them behind authentication in production). Each command is
recorded in the label's history as forced, with the given reason.
"""

from __future__ import annotations

from typing import Any

import flask
from werkzeug.exceptions import Conflict

from routemaster import service
from routemaster.api.labels import LABEL, label_body
from routemaster.app import App
from routemaster.auth import OPERATE
from routemaster.config.model import StateMachine
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.request_checks import aware_time, checked_body
from routemaster.webcore.responses import json_response

blueprint = flask.Blueprint("operations", __name__)

COMMAND_REPLIES = {
    200: Reply("Label"),
    400: Reply("Error"),
    404: Reply("Error"),
    409: Reply("Error", description="The command does not apply to the label as it is"),
    410: Reply("Error"),
}


@blueprint.post(LABEL + "/retry")
@endpoint(
    OPERATE,
    "Retry an errored action delivery (recorded as forced)",
    COMMAND_REPLIES,
    body="Command",
    body_required=False,
    tags=("operators",),
)
def retry(sm: str, label: str) -> flask.Response:
    """Make an errored action delivery due again with a fresh attempt count."""
    app, machine, reason, _ = _command(sm, label)
    return _run(lambda: service.retry_label(app, machine, label, reason=reason))


@blueprint.post(LABEL + "/pause")
@endpoint(
    OPERATE,
    "Pause a label: nothing moves it until it is resumed (or until `until`)",
    COMMAND_REPLIES,
    body="Pause",
    body_required=False,
    tags=("operators",),
)
def pause(sm: str, label: str) -> flask.Response:
    """With ``{"until": ISO-8601}`` the label resumes by itself then."""
    app, machine, reason, body = _command(sm, label)
    until = service.pause_end(app, aware_time(body.get("until")))
    return _run(
        lambda: service.set_label_paused(app, machine, label, True, reason=reason, until=until)
    )


@blueprint.post(LABEL + "/resume")
@endpoint(
    OPERATE,
    "Resume a paused label",
    COMMAND_REPLIES,
    body="Command",
    body_required=False,
    tags=("operators",),
)
def resume(sm: str, label: str) -> flask.Response:
    app, machine, reason, _ = _command(sm, label)
    return _run(lambda: service.set_label_paused(app, machine, label, False, reason=reason))


@blueprint.post(LABEL + "/move")
@endpoint(
    OPERATE,
    "Move a label to a state regardless of conditions (recorded as forced)",
    COMMAND_REPLIES,
    body="Move",
    tags=("operators",),
)
def move(sm: str, label: str) -> flask.Response:
    """Body ``{"state": S, "reason": "..."}``: put the label in ``S`` regardless of conditions."""
    app, machine, reason, body = _command(sm, label)
    destination: str = body["state"]
    return _run(lambda: service.force_move(app, machine, label, destination, reason=reason))


def _command(sm: str, label: str) -> tuple[App, StateMachine, str | None, dict[str, Any]]:
    """What every command needs: the app, the machine (or 404), the reason and the body."""
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    body = checked_body(optional=True) or {}
    return app, machine, body.get("reason"), body


def _run(command: Any) -> flask.Response:
    try:
        return json_response(label_body(command()))
    except service.InvalidOperation as error:
        raise Conflict(str(error)) from None
