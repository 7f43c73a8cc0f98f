"""``GET /``: is the service up, and can it reach its database?"""

from __future__ import annotations

import flask

from routemaster import __version__
from routemaster.service.database import database_answers
from routemaster.webcore.endpoints import OPEN, Reply, endpoint
from routemaster.webcore.error_responses import DATABASE_UNAVAILABLE
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.responses import json_response

blueprint = flask.Blueprint("health", __name__)


@blueprint.get("/")
@endpoint(
    OPEN,
    "Health: is the service up and its database reachable?",
    {200: Reply("Health"), 503: Reply("HealthError")},
    tags=("service",),
)
def status() -> flask.Response:
    """200 when a pooled connection answers a ping; 503 otherwise.

    The engine's ``pool_pre_ping`` replaces connections broken by an outage,
    so the answer returns to 200 by itself once the database is back.
    """
    if not database_answers(routemaster_app()):
        return json_response(
            {"status": "error", "message": DATABASE_UNAVAILABLE, "version": __version__}, 503
        )
    return json_response(
        {"status": "ok", "state-machines": "/state-machines", "version": __version__}
    )
