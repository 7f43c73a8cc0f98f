"""``GET .../labels/{label}/explain``: why is this label not moving?

For a gate: its exit condition evaluated now, clause by clause with the
values it saw, its triggers, and where the label would go if the condition
held. For an action: the delivery bookkeeping (attempts, errored, last error,
when it is next due), and its last three outbound calls. Nothing here moves
the label or changes it (the feed calls it makes are in the delivery log, as
every outbound call is).
"""

from __future__ import annotations

from typing import Any

import flask

from routemaster import service
from routemaster.api.deliveries import delivery_json
from routemaster.api.labels import LABEL, live_label
from routemaster.api.task_views import action_explanation, paused_until
from routemaster.app import App
from routemaster.auth import READ
from routemaster.config import describe_machine
from routemaster.config.model import Action, StateMachine
from routemaster.exit_conditions import FeedUnavailable
from routemaster.machine import choose_next_state
from routemaster.machine.triggers import what_evaluates
from routemaster.service import deliveries
from routemaster.service.scheduling import explain_next_check
from routemaster.service.versions import machine_for
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.responses import isoformat, json_response

blueprint = flask.Blueprint("explanations", __name__)


@blueprint.get(LABEL + "/explain")
@endpoint(
    READ,
    "Why a label is not moving: its condition evaluated clause by clause",
    {200: Reply("Explanation"), 404: Reply("Error"), 410: Reply("Error")},
    tags=("labels",),
)
def explain(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    return json_response(explanation_of(app, machine, live_label(app, machine, label)))


def explanation_of(app: App, machine: StateMachine, found: service.Label) -> dict[str, Any]:
    """Why the label is where it is, as JSON: for the API and the console."""
    body: dict[str, Any] = {
        "state": found.state,
        "state_entered_at": isoformat(found.state_entered_at),
        "previous_state": found.previous_state,
        "paused": found.paused,
        "errored": found.errored,
        "last_error": found.last_error,
        "attempts": found.attempts,
        "due_at": isoformat(found.due_at),
        "next_check_at": None,
        "next_check_reason": None,
        "recent_deliveries": recent_deliveries(app, machine, found.name),
    }
    if found.paused:
        body["paused_until"] = isoformat(paused_until(app, found))
    machine = machine_for(app, found) or machine  # its own version's, on a continue machine
    try:
        state = machine.get_state(found.state)
    except KeyError:
        body["kind"] = None
        body["message"] = "The configuration no longer has this state; the label cannot move."
        return body
    described = {entry["name"]: entry for entry in describe_machine(machine)["states"]}
    body["kind"] = "action" if isinstance(state, Action) else "gate"
    body["next"] = described[state.name].get("next")
    if isinstance(state, Action):
        body.update(action_explanation(app, state, found))
        return body
    body["triggers"] = described[state.name].get("triggers", [])
    check = explain_next_check(app, machine, found)
    if check is not None:
        body["next_check_at"] = isoformat(check.at)
        body["next_check_reason"] = check.reason
    context = service.label_context(
        app, machine, found, feed_timeout=app.settings.feed_timeout_in_request
    )
    explanation = state.exit_condition.explain(context)
    body["exit_condition"] = explanation.to_json()
    if explanation.result is not None:
        try:
            body["next_state_if_held"] = choose_next_state(state.next_states, context)
        except FeedUnavailable as error:
            body["next_state_error"] = str(error)
    if explanation.result and not (found.paused or found.errored) and found.due_at is None:
        events = what_evaluates(state)
        body["message"] = "The exit condition holds, but no evaluation is scheduled: " + (
            f"the label moves on when {events} evaluates the gate."
            if events
            else "the gate has no trigger that fires while a label waits in it, "
            "so only an operator's move takes it on."
        )
    return body


def recent_deliveries(app: App, machine: StateMachine, name: str) -> list[dict[str, Any]]:
    """The label's last three outbound calls, newest first."""
    return [delivery_json(row) for row in deliveries.of_label(app, machine.name, name, limit=3)]
