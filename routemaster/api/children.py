"""A parent's children (SPEC G3): ``GET /state-machines/{sm}/labels/{label}/children``.

Keyset paging as every listing: the children in the order they were spawned,
``next`` starting after the last shown (its index in the parent's list).
"""

from __future__ import annotations

from typing import Any

import flask

from routemaster.auth import READ
from routemaster.service.children import OUTCOME_FILTERS, list_children
from routemaster.webcore.endpoints import Query, Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.paging import next_link, page_of
from routemaster.webcore.paths import link
from routemaster.webcore.request_checks import checked_query
from routemaster.webcore.responses import json_response

blueprint = flask.Blueprint("children", __name__)

DEFAULT_PAGE = 100
MAX_PAGE_SIZE = 10_000


@blueprint.get("/state-machines/<name:sm>/labels/<name:label>/children")
@endpoint(
    READ,
    "A label's children: the labels its spawn states created",
    {200: Reply("Children"), 400: Reply("Error"), 404: Reply("Error")},
    query=(
        Query(
            "outcome",
            {"enum": list(OUTCOME_FILTERS)},
            "Only children that succeeded, failed (deleted ones too), or are still running.",
        ),
        Query(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
            f"Page size (default {DEFAULT_PAGE}).",
        ),
        Query(
            "after",
            {"type": "integer", "minimum": -1},
            "Start after this index in the parent's list (from `next`).",
        ),
    ),
    tags=("labels",),
)
def children(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    args = checked_query()
    outcome: str | None = args.get("outcome")
    limit: int = args.get("limit", DEFAULT_PAGE)
    after: int = args.get("after", -1)
    page = page_of(
        lambda size: list_children(app, machine, label, outcome=outcome, after=after, limit=size),
        limit,
    )
    body: dict[str, Any] = {
        "children": [
            {
                "state_machine": child.state_machine,
                "label": child.label,
                "state": child.state,
                "outcome": child.outcome,
                "metadata": child.metadata,
            }
            for child in page.rows
        ],
        "next": None,
    }
    if page.last is not None:
        query = {"limit": str(limit), "after": str(page.last.position)}
        if outcome is not None:
            query["outcome"] = outcome
        body["next"] = next_link(
            link("state-machines", machine.name, "labels", label, "children"), query
        )
    return json_response(body)
