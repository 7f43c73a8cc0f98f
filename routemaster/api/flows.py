"""Flows (SPEC G2): ``GET /flows`` and ``GET /flows/{name}/keys``, what waits and what holds
slots per flow and per key. How flows are claimed: :mod:`routemaster.service.flow_claims`."""

from __future__ import annotations

import flask

from routemaster.auth import READ
from routemaster.service import flows
from routemaster.service.refusals import Missing
from routemaster.webcore.endpoints import Query, Reply, endpoint
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.request_checks import checked_query
from routemaster.webcore.responses import json_response

blueprint = flask.Blueprint("flows", __name__)

DEFAULT_KEYS = 20
MAX_KEYS = 1000
FLOW_NAME = {"type": "string", "minLength": 1, "maxLength": 1000}


@blueprint.get("/flows")
@endpoint(
    READ,
    "Every flow: keys and labels waiting their turn, labels holding a slot",
    {200: Reply("FlowList")},
    tags=("flows",),
)
def list_flows() -> flask.Response:
    return json_response({"flows": flows.flow_list(routemaster_app())})


@blueprint.get("/flows/<name:name>/keys")
@endpoint(
    READ,
    "A flow's keys with the most labels waiting, most first",
    {200: Reply("FlowKeyList"), 400: Reply("Error"), 404: Reply("Error")},
    query=(
        Query(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_KEYS},
            f"How many keys (default {DEFAULT_KEYS}).",
        ),
    ),
    tags=("flows",),
    path={"name": FLOW_NAME},
)
def flow_keys(name: str) -> flask.Response:
    app = routemaster_app()
    args = checked_query()
    keys = flows.busiest_keys(app, name, limit=int(args.get("limit", DEFAULT_KEYS)))
    if keys is None:
        raise Missing(f"no flow called {name!r}")
    return json_response({"flow": name, "keys": keys})
