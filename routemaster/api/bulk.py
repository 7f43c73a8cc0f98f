"""Bulk commands: ``POST /state-machines/{sm}/bulk`` and ``GET /bulk/{id}``.

A dry run answers how many labels match and a sample of them. A real run
needs at least one filter and ``expect`` (the count the caller saw), so a
typo cannot retry or delete a whole machine; it is accepted (202) with the
set of labels fixed, and the workers carry it out in batches.
"""

from __future__ import annotations

from typing import Any

import flask
from werkzeug.exceptions import Forbidden, NotFound

from routemaster.api.auth import current_token
from routemaster.auth import OPERATE, WRITE
from routemaster.service.bulk import (
    CountMismatch,
    accept,
    command_from,
    dry_run,
    get_job,
    labels_for,
)
from routemaster.service.operations import pause_end
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.request_checks import aware_time, checked_body
from routemaster.webcore.responses import json_response

blueprint = flask.Blueprint("bulk", __name__)


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
    until = pause_end(app, aware_time(body.get("until")))
    command = command_from(body, until=until)
    search = labels_for(app, machine, command)
    if command.command == "delete" and token is not None and WRITE not in token.scopes:
        raise Forbidden(f"The token {token.name!r} lacks the 'write' scope delete needs.")
    if body.get("dry_run") is True:
        return json_response(dry_run(app, search))
    try:
        job, count = accept(app, search, command, expect=body["expect"])
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
