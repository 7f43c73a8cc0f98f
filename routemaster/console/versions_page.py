"""The console's page of a machine's versions, and what changed between two of them."""

from __future__ import annotations

import flask
from werkzeug.exceptions import BadRequest, NotFound

from routemaster.console.views import PAGES, blueprint
from routemaster.machine.upgrades import compare_definitions
from routemaster.service.configuration import versions_of
from routemaster.webcore.endpoints import OPEN, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app

SHOWN = 1_000


@blueprint.get("/machines/<name:sm>/versions")
@endpoint(
    OPEN, "The console: a machine's versions, and the difference of two", PAGES, tags=("console",)
)
def versions_page(sm: str) -> str:
    """Every version (newest first); ``?from=A&to=B`` shows what changed from A to B."""
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    versions = versions_of(app, machine.name, after=0, limit=SHOWN)
    by_number = {version.version: version for version in versions}
    args = flask.request.args
    compared, pair = None, None
    if "from" in args or "to" in args:
        pair = (_number(args.get("from")), _number(args.get("to")))
        for number in pair:
            if number not in by_number:
                raise NotFound(f"{machine.name} has no version {number}.")
        compared = compare_definitions(by_number[pair[1]].definition, by_number[pair[0]].definition)
    latest = versions[-1].version if versions else None
    return flask.render_template(
        "console/versions.html",
        access=flask.g.get("access"),
        notice=None,
        problem=None,
        after=None,
        seen=None,
        machine=machine,
        versions=list(reversed(versions)),
        compared=compared,
        compared_pair=pair,
        default_from=(latest - 1) if latest and latest > 1 else latest,
        default_to=latest,
    )


def _number(raw: str | None) -> int:
    try:
        return int(raw or "")
    except ValueError:
        raise BadRequest("Choose two versions by number.") from None
