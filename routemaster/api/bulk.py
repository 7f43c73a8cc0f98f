"""Bulk commands: ``POST /state-machines/{sm}/bulk`` and ``GET /bulk/{id}``.

A dry run answers how many labels match and a sample of them. A real run
needs at least one filter and ``expect`` (the count the caller saw), so a
typo cannot retry or delete a whole machine; it is accepted (202) with the
set of labels fixed, and the workers carry it out in batches.
"""

from __future__ import annotations

from typing import Any

import flask
from werkzeug.exceptions import BadRequest, Forbidden, NotFound

from routemaster.api.auth import current_token
from routemaster.api.operations import pause_end
from routemaster.app import App
from routemaster.auth import OPERATE, WRITE
from routemaster.config.model import StateMachine
from routemaster.service.bulk import BulkCommand, CountMismatch, accept, dry_run, get_job
from routemaster.service.search import Search, listing_search, not_on_version
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.responses import json_response
from routemaster.webcore.validation import checked_body

blueprint = flask.Blueprint("bulk", __name__)

FILTERS = ("where", "state", "errored", "prefix")


@blueprint.post("/state-machines/<name:sm>/bulk")
@endpoint(
    OPERATE,
    "Run an operator command on every label matching filters (write scope too for delete)",
    {
        200: Reply("BulkDryRun", description="A dry run: the count and a sample"),
        202: Reply("BulkAccepted", description="Accepted: the workers carry it out"),
        400: Reply("Error"),
        403: Reply("Error", description="delete needs the write scope as well"),
        404: Reply("Error"),
        409: Reply("BulkMismatch", description="expect differs from the count"),
    },
    body="Bulk",
    tags=("operators",),
)
def start_bulk(sm: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    body: dict[str, Any] = checked_body()
    token = current_token()
    command, search = bulk_request(app, machine, body)
    if command.command == "delete" and token is not None and WRITE not in token.scopes:
        raise Forbidden(f"The token {token.name!r} lacks the 'write' scope delete needs.")
    if body.get("dry_run") is True:
        return json_response(dry_run(app, search))
    try:
        job, count = run(app, command, search, body)
    except CountMismatch as mismatch:
        return json_response(
            {
                "message": f"{mismatch.count} labels match, not {body['expect']}: nothing done.",
                "reason": "count_mismatch",
                "count": mismatch.count,
            },
            409,
        )
    return json_response({"id": job, "count": count}, 202)


def bulk_request(
    app: App, machine: StateMachine, body: dict[str, Any]
) -> tuple[BulkCommand, Search]:
    """The command a body (checked against ``Bulk``) asks for and the labels it is for.

    400 saying what is wrong with what the schema cannot check: the state to
    move to, the time a pause ends.
    """
    command = _command(app, machine, body)
    search = listing_search(
        app,
        machine,
        command.where,
        state=command.state,
        errored=command.errored,
        prefix=command.prefix,
    )
    if command.command == "upgrade":  # only labels not on the version in force yet
        search = not_on_version(search, app.versions.in_force[machine.name])
    return command, search


def run(app: App, command: BulkCommand, search: Search, body: dict[str, Any]) -> tuple[int, int]:
    """Accept a real run (the schema has made sure of a filter and ``expect``): ``(id, count)``.

    Raises :class:`CountMismatch` when ``expect`` is not the count.
    """
    return accept(app, search, command, expect=body["expect"])


@blueprint.get("/bulk/<int:job>")
@endpoint(
    OPERATE,
    "A bulk command's progress",
    {200: Reply("BulkJob"), 404: Reply("Error")},
    tags=("operators",),
)
def bulk_progress(job: int) -> flask.Response:
    found = get_job(routemaster_app(), job)
    if found is None:
        raise NotFound(f"There is no bulk command {job}.")
    return json_response(
        {
            "id": found.id,
            "command": found.command,
            "state_machine": found.state_machine,
            "total": found.total,
            "done": found.done,
            "skipped": found.skipped,
            "failed": found.failed,
            "state": "running" if found.finished_at is None else "finished",
            **({} if found.pause_until is None else {"until": found.pause_until.isoformat()}),
        }
    )


def _command(app: App, machine: StateMachine, body: dict[str, Any]) -> BulkCommand:
    command = body["command"]
    until = pause_end(app, body.get("until"))
    to = body.get("to")
    if to is not None:
        try:
            machine.get_state(to)
        except KeyError:
            raise BadRequest(f"State machine {machine.name!r} has no state {to!r}.") from None
    if command == "upgrade" and not machine.continues:
        raise BadRequest(
            f"State machine {machine.name!r} has upgrade_strategy {machine.upgrade_strategy}:"
            " only the labels of a continue machine keep a version to upgrade from."
        )
    if command == "upgrade" and app.versions.in_force.get(machine.name) is None:
        raise BadRequest("This process recorded no version of the machine to upgrade to.")
    return BulkCommand(
        command=command,
        reason=body["reason"],
        where=body.get("where"),
        state=body.get("state"),
        errored=bool(body.get("errored")),
        prefix=body.get("prefix") or "",
        to=to,
        until=until,
    )
