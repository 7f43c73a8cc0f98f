"""Why a label is where it is: the read model ``GET .../explain`` and the console's label page show.

It picks the version that governs the label, evaluates its gate now (the
feed calls it makes are in the delivery log, as every outbound call is),
and words the reasons; nothing here moves or changes the label. The answer
is shaped as the ``Explanation`` schema, with times as ``datetime`` and the
recent calls as :class:`~routemaster.service.reads.Delivery` rows: the
web core renders both (:func:`routemaster.webcore.responses.explanation_json`).
"""

from __future__ import annotations

from typing import Any

from routemaster.app import App
from routemaster.config import describe_machine
from routemaster.config.graph import worker_settings
from routemaster.config.model import Action, NoNext, Spawn, StateMachine
from routemaster.db import deliveries, pauses, task_records
from routemaster.db.labels import Label
from routemaster.exit_conditions import FeedUnavailable
from routemaster.exit_conditions.values import format_duration
from routemaster.machine import choose_next_state
from routemaster.machine.triggers import what_evaluates
from routemaster.service import children as children_service
from routemaster.service import flows as flow_service
from routemaster.service.labels import label_context
from routemaster.service.scheduling import explain_next_check
from routemaster.service.transactions import reading
from routemaster.service.versions import machine_for

RECENT_CALLS = 3


def explanation_of(app: App, machine: StateMachine, found: Label) -> dict[str, Any]:
    """Why the label is where it is: for the API and the console."""
    with reading(app) as conn:
        recent = deliveries.of_label(conn, machine.name, found.name, limit=RECENT_CALLS)
        resumes = pauses.paused_until(conn, *found.key) if found.paused else None
    body: dict[str, Any] = {
        "state": found.state,
        "state_entered_at": found.state_entered_at,
        "previous_state": found.previous_state,
        "paused": found.paused,
        "errored": found.errored,
        "last_error": found.last_error,
        "attempts": found.attempts,
        "due_at": found.due_at,
        "next_check_at": None,
        "next_check_reason": None,
        "recent_deliveries": recent,
    }
    if found.paused:
        body["paused_until"] = resumes
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
        body.update(_action_explanation(app, state, found))
        return body
    if isinstance(state, Spawn):
        body["kind"] = "spawn"
        body.update(children_service.explain(app, found, state))
        return body
    body["triggers"] = described[state.name].get("triggers", [])
    check = explain_next_check(app, machine, found)
    if check is not None:
        body["next_check_at"] = check.at
        body["next_check_reason"] = check.reason
    context = label_context(app, machine, found, feed_timeout=app.settings.feed_timeout_in_request)
    explanation = state.exit_condition.explain(context)
    body["exit_condition"] = explanation.to_json()
    if explanation.result is not None:
        try:
            body["next_state_if_held"] = choose_next_state(state.next_states, context)
        except FeedUnavailable as error:
            body["next_state_error"] = str(error)
    if isinstance(state.next_states, NoNext):
        body["message"] = _end_state_message(machine)
    elif explanation.result and not (found.paused or found.errored) and found.due_at is None:
        events = what_evaluates(state)
        body["message"] = "The exit condition holds, but no evaluation is scheduled: " + (
            f"the label moves on when {events} evaluates the gate."
            if events
            else "the gate has no trigger that fires while a label waits in it, "
            "so only an operator's move takes it on."
        )
    return body


def _end_state_message(machine: StateMachine) -> str:
    """A gate without ``next`` is where labels finish: no metadata or time will move them."""
    finished = machine.retention.finished
    return "An end state: the label has finished here and stays; no metadata, time or trigger " + (
        "moves it on, only an operator's move."
        if finished is None
        else f"moves it on. Retention deletes it {format_duration(finished)} after it entered."
    )


def _action_explanation(app: App, action: Action, label: Label) -> dict[str, Any]:
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
    if action.flow is not None:
        body["waiting_for"] = flow_service.waiting_for(app, action.flow, label)
    with reading(app) as conn:
        held = task_records.current(conn, *label.key, now=app.now())
    body["task"] = (
        None
        if held is None
        else {
            "worker": held.worker,
            "attempt": held.attempt,
            "claimed_at": held.claimed_at,
            "lease_expires_at": held.lease_expires_at,
            "lease": {
                "seconds": held.lease.total_seconds(),
                "source": held.lease_source or "fixed",
                "samples": held.lease_samples or 0,
            },
        }
    )
    return body
