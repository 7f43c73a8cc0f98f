"""The console's bulk action: count first, then run on exactly that many, then watch it.

The labels page's form posts the filters and the command here without a
count: the answer is a page with the dry run's count and a sample, and a
button that posts the same again with ``expect`` set to that count. If the
count changed meanwhile nothing is done and the operator is told so. Both
posts carry the console's CSRF token, as the label buttons do.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import flask
from werkzeug.exceptions import BadRequest, Forbidden, NotFound
from werkzeug.wrappers import Response

from routemaster.console import access
from routemaster.console.views import BUTTON, PAGES, blueprint, machine_url, render_page
from routemaster.service.bulk import (
    FILTERS,
    CountMismatch,
    accept,
    command_from,
    dry_run,
    get_job,
    labels_for,
)
from routemaster.service.operations import pause_end
from routemaster.webcore.endpoints import OPEN, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.request_checks import aware_time, checked_value

_FORM_FIELDS = ("command", "reason", "to", "until", *FILTERS)


@blueprint.post("/machines/<name:sm>/bulk")
@endpoint(
    OPEN,
    "The console: a bulk command, counted before it runs",
    {**BUTTON, 200: PAGES[200]},
    tags=("console",),
)
def bulk(sm: str) -> Response | str:
    access.check_csrf()
    if not flask.g.access.may("operate"):
        raise Forbidden("This token may not operate labels.")
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    body = _body(flask.request.form)
    if body.get("command") == "delete" and not flask.g.access.may("write"):
        raise Forbidden("Deleting labels needs a token with the write scope.")
    checked_value("Bulk", body if "expect" in body else {**body, "dry_run": True})
    command = command_from(body, until=pause_end(app, aware_time(body.get("until"))))
    search = labels_for(app, machine, command)
    if "expect" not in body:
        counted = dry_run(app, search)
        fields = {key: value for key, value in flask.request.form.items() if key in _FORM_FIELDS}
        return render_page(
            "bulk_confirm.html",
            machine=machine,
            command=command,
            count=counted["count"],
            sample=counted["sample"],
            fields=fields,
        )
    try:
        job, _ = accept(app, search, command, expect=body["expect"])
    except CountMismatch as mismatch:
        problem = f"{mismatch.count} labels match now, not {body['expect']}: nothing was done."
        back = machine_url(machine.name, "labels") + "?" + urlencode({"problem": problem})
        return flask.redirect(back, 303)
    return flask.redirect(f"/console/bulk/{job}", 303)


@blueprint.get("/bulk/<int:job>")
@endpoint(OPEN, "The console: a bulk command's progress", PAGES, tags=("console",))
def bulk_progress(job: int) -> str:
    found = get_job(routemaster_app(), job)
    if found is None:
        raise NotFound(f"There is no bulk command {job}.")
    back = machine_url(found.state_machine, "labels")
    return render_page("bulk.html", job=found, back=back, machine=None)


def _body(form: Any) -> dict[str, Any]:
    """The form as the API's JSON body: empty fields left out, a checked box true."""
    body: dict[str, Any] = {
        key: form[key]
        for key in ("command", "reason", "to", "until", "where", "state", "prefix")
        if form.get(key)
    }
    if form.get("errored") == "true":
        body["errored"] = True
    if form.get("expect"):
        try:
            body["expect"] = int(form["expect"])
        except ValueError:
            raise BadRequest("expect must be a number.") from None
    return body
