"""A machine's versions: each distinct definition a process started with, oldest first."""

from __future__ import annotations

from typing import Any

import flask

from routemaster.auth import READ
from routemaster.service.configuration import MachineVersion, versions_of
from routemaster.webcore.endpoints import Query, Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.paging import next_link, page_of
from routemaster.webcore.paths import link
from routemaster.webcore.request_checks import checked_query
from routemaster.webcore.responses import isoformat, json_response

MAX_PAGE = 1_000
DEFAULT_PAGE = 100

blueprint = flask.Blueprint("versions", __name__)


@blueprint.get("/state-machines/<name:sm>/versions")
@endpoint(
    READ,
    "A machine's versions: each distinct definition processes started with",
    {200: Reply("Versions"), 400: Reply("Error"), 404: Reply("Error")},
    query=(
        Query(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
            f"Page size (default {DEFAULT_PAGE}).",
        ),
        Query(
            "after",
            {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
            "Start after this version (from `next`).",
        ),
    ),
    tags=("machines",),
)
def list_versions(sm: str) -> flask.Response:
    """Oldest first; ``next`` links the following page, null on the last."""
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    args = checked_query()
    limit: int = args.get("limit", DEFAULT_PAGE)
    after: int = args.get("after", 0)
    page = page_of(lambda n: versions_of(app, machine.name, after=after, limit=n), limit)
    body: dict[str, Any] = {"versions": [version_body(version) for version in page.rows]}
    body["next"] = (
        None
        if page.last is None
        else next_link(
            link("state-machines", machine.name, "versions"),
            {"limit": str(limit), "after": str(page.last.version)},
        )
    )
    return json_response(body)


def version_body(version: MachineVersion) -> dict[str, Any]:
    return {
        "version": version.version,
        "applied_at": isoformat(version.applied_at),
        "digest": version.digest,
        "definition": version.definition,
    }
