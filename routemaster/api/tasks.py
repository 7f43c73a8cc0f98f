"""Pull workers' endpoints (SPEC D1): ``POST /tasks/claim`` and the calls made with a task id.

Claiming needs the ``work`` scope. Heartbeat, complete, fail and release are
authorized by the task id in the path (an unguessable capability): they need
no token, and accept a valid one. A stale id answers 409 with
``"reason": "lease_lost"``, an id never issued 404.
"""

from __future__ import annotations

from typing import Any

import flask
from werkzeug.exceptions import BadRequest, NotFound, ServiceUnavailable

from routemaster.api.auth import require_scope
from routemaster.api.labels import LABEL, label_body, live_label
from routemaster.app import App
from routemaster.auth import READ, WORK
from routemaster.hubs.changes import STREAM_KEY
from routemaster.hubs.claim_waits import ClaimWaiter, TooManyWaiting, task_json
from routemaster.service import tasks as task_service
from routemaster.webcore.endpoints import CAPABILITY, Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.request_checks import checked_body
from routemaster.webcore.responses import isoformat, json_response, past_tasks

blueprint = flask.Blueprint("tasks", __name__)

CLAIMS_KEY = "routemaster.pull_claims"
WAITER_KEY = "routemaster.claims"
HISTORY_LIMIT = 100  # a label's latest tasks shown
TASK = "/tasks/<task_id>"
NO_STORE = {"Cache-Control": "no-store"}

CLAIM_REFUSED = Reply(
    "Error",
    description="The request is outside this document, or `state` is not a pull action "
    "(worker:) of the configuration",
)
TASK_REPLIES = {
    400: Reply("Error"),
    404: Reply("Error", description="No task with this id was ever issued"),
    409: Reply(
        "Error",
        description='The lease is over ("reason": "lease_lost"): it ran out, the task was '
        "completed, failed or released, or the label left the action",
    ),
}


def install(flask_app: flask.Flask, app: App) -> None:
    """The process's pull claims, and its waiter for the claims that wait."""
    claims = flask_app.extensions[CLAIMS_KEY] = task_service.PullClaims(app)
    flask_app.extensions[WAITER_KEY] = ClaimWaiter(app, claims)


def pull_claims(flask_app: flask.Flask) -> task_service.PullClaims:
    claims = flask_app.extensions[CLAIMS_KEY]
    assert isinstance(claims, task_service.PullClaims)
    return claims


def claim_waiter(flask_app: flask.Flask) -> ClaimWaiter:
    waiter = flask_app.extensions[WAITER_KEY]
    assert isinstance(waiter, ClaimWaiter)
    return waiter


@blueprint.post("/tasks/claim")
@endpoint(
    WORK,
    "Claim due labels of pull actions (worker:), waiting up to `wait` seconds for one",
    {
        200: Reply("TaskList"),
        400: CLAIM_REFUSED,
        404: Reply("Error"),
        503: Reply("Error", description="This process has too many waiting claims"),
    },
    body="Claim",
    tags=("tasks",),
)
def claim() -> flask.Response:
    claim_request, wait = _claim_request(checked_body())
    tasks = pull_claims(flask.current_app).claim(claim_request)
    return _claimed(claim_request, wait, tasks)


@blueprint.post("/tasks/complete")
@endpoint(
    CAPABILITY,
    "Complete many tasks in order, then claim the next ones (with `claim`), in one request",
    {
        200: Reply("Completed"),
        400: CLAIM_REFUSED,
        404: Reply("Error", description="`claim` names a state machine that does not exist"),
        503: Reply("Error", description="This process has too many waiting claims"),
    },
    body="Completions",
    tags=("tasks",),
    scope_with=("claim", WORK),
)
def complete_many() -> flask.Response:
    body = checked_body()
    wanted = body.get("claim")
    completions = [(task["id"], task.get("metadata")) for task in body["tasks"]]
    then, wait = None, 0.0
    if wanted is not None:
        refused = require_scope(flask.current_app, WORK, 'Completing with a "claim"')
        if refused is not None:
            return refused
        then, wait = _claim_request(wanted)  # a bad claim completes nothing
    done, claimed = pull_claims(flask.current_app).complete_and_claim(completions, then)
    completed = {"completed": [_completed(answer) for answer in done]}
    if then is None:
        return json_response({**completed, "tasks": []}, headers=NO_STORE)
    return _claimed(then, wait, claimed, before=completed)


def _claim_request(body: dict[str, Any]) -> tuple[task_service.NextClaim, float]:
    """A claim (checked against ``Claim``): its pull actions, worker, limit and wait; 400
    or 404 when the machine or the state is not one."""
    app = routemaster_app()
    worker: str = body["worker"]
    machine: str | None = body.get("state_machine")
    state: str | None = body.get("state")
    limit: int = body.get("limit", 1)
    wait: float = body.get("wait", 0)
    if machine is not None:
        machine_or_404(app, machine)
    try:
        states = task_service.pull_states(app.config, machine, state)
    except task_service.NoSuchPullState as error:
        raise BadRequest(
            f"{error}" + (f" in state machine {machine!r}." if machine else ".")
        ) from None
    return task_service.NextClaim(states, worker, limit), wait


def _claimed(
    claim_request: task_service.NextClaim,
    wait: float,
    tasks: list[task_service.Task],
    *,
    before: dict[str, Any] | None = None,
) -> flask.Response:
    """The claim's answer, after the fields of ``before``: these tasks, or, when there are
    none and the claim may wait, the answer the claim waiter gives later (a claim that does
    not wait never reaches it)."""
    if tasks or not wait:
        answer = {**(before or {}), "tasks": [task_json(task) for task in tasks]}
        return json_response(answer, headers=NO_STORE)
    try:
        pending = claim_waiter(flask.current_app).wait_for(
            claim_request, wait, tasks, before=before
        )
    except TooManyWaiting as error:
        raise ServiceUnavailable(
            f"Too many waiting claims in this process ({error}): retry shortly."
        ) from None
    if pending is None:
        answer = {**(before or {}), "tasks": [task_json(task) for task in tasks]}
        return json_response(answer, headers=NO_STORE)
    # Under our gunicorn workers the server takes the socket and the waiter answers on it.
    flask.request.environ[STREAM_KEY] = pending
    return flask.Response(pending.body(), mimetype="application/json", headers=NO_STORE)


def _completed(answer: task_service.Completed) -> dict[str, Any]:
    """One completion as /tasks/{id}/complete would have answered it."""
    if answer.label is not None:
        return {"id": answer.task_id, "status": 200, "label": label_body(answer.label)}
    if isinstance(answer.refusal, task_service.LeaseLost):
        return {
            "id": answer.task_id,
            "status": 409,
            "message": str(answer.refusal),
            "reason": "lease_lost",
        }
    return {"id": answer.task_id, "status": 404, "message": str(answer.refusal)}


@blueprint.post(TASK + "/heartbeat")
@endpoint(
    CAPABILITY,
    "Keep a task's lease: it runs for its full length again from now",
    {200: Reply("Heartbeat"), **TASK_REPLIES},
    body="Empty",
    body_required=False,
    tags=("tasks",),
)
def heartbeat(task_id: str) -> flask.Response:
    checked_body(optional=True)
    app = routemaster_app()
    return _answer(lambda: {"lease_expires_at": isoformat(task_service.heartbeat(app, task_id))})


@blueprint.post(TASK + "/complete")
@endpoint(
    CAPABILITY,
    "Complete a task: merge metadata (as PATCH) and move the label on",
    {200: Reply("Label"), **TASK_REPLIES},
    body="Completion",
    body_required=False,
    tags=("tasks",),
)
def complete(task_id: str) -> flask.Response:
    metadata = (checked_body(optional=True) or {}).get("metadata")
    app = routemaster_app()
    return _answer(lambda: label_body(task_service.complete(app, task_id, metadata)))


@blueprint.post(TASK + "/fail")
@endpoint(
    CAPABILITY,
    "Fail a task: retried after the action's backoff (or retry_after), or errored",
    {200: Reply("Label"), **TASK_REPLIES},
    body="Failure",
    tags=("tasks",),
)
def fail(task_id: str) -> flask.Response:
    body = checked_body()
    error: str = body["error"]
    retry: bool = body.get("retry", True)
    retry_after: float | None = body.get("retry_after")
    app = routemaster_app()
    rng = pull_claims(flask.current_app).rng
    return _answer(
        lambda: label_body(
            task_service.fail(
                app, task_id, error=error, retry=retry, retry_after=retry_after, rng=rng
            )
        )
    )


@blueprint.post(TASK + "/release")
@endpoint(
    CAPABILITY,
    "Release a task: the label is due again at once, no attempt counted",
    {200: Reply("Label"), **TASK_REPLIES},
    body="Empty",
    body_required=False,
    tags=("tasks",),
)
def release(task_id: str) -> flask.Response:
    checked_body(optional=True)
    app = routemaster_app()
    return _answer(lambda: label_body(task_service.release(app, task_id)))


@blueprint.get(LABEL + "/tasks")
@endpoint(
    READ,
    "A label's latest tasks (attempts by pull workers and 202 callbacks), oldest first",
    {200: Reply("TaskHistory"), 404: Reply("Error"), 410: Reply("Error")},
    tags=("tasks", "labels"),
)
def label_tasks(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    found = live_label(app, machine_or_404(app, sm), label)
    return json_response({"tasks": past_tasks(app, found, limit=HISTORY_LIMIT)})


def _answer(act: Any) -> flask.Response:
    try:
        return json_response(act(), headers=NO_STORE)
    except task_service.TaskNotFound as error:
        raise NotFound(str(error)) from None
    except task_service.LeaseLost as error:
        return json_response({"message": str(error), "reason": "lease_lost"}, 409)
