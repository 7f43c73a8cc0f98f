"""``GET .../labels/{label}/explain``: why is this label not moving?

For a gate: its exit condition evaluated now, clause by clause with the
values it saw, its triggers, and where the label would go if the condition
held. For an action: the delivery bookkeeping (attempts, errored, last error,
when it is next due), and its last three outbound calls. The explanation is
the service's read model (:mod:`routemaster.service.explanations`); the
console's label page shows the same.
"""

from __future__ import annotations

import flask

from routemaster.api.labels import LABEL, live_label
from routemaster.auth import READ
from routemaster.service.explanations import explanation_of
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.responses import explanation_json, json_response

blueprint = flask.Blueprint("explanations", __name__)


@blueprint.get(LABEL + "/explain")
@endpoint(
    READ,
    "Why a label is not moving: its condition evaluated clause by clause",
    {200: Reply("Explanation"), 404: Reply("Error"), 410: Reply("Error")},
    tags=("labels",),
)
def explain(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    found = live_label(app, machine, label)
    return json_response(explanation_json(explanation_of(app, machine, found)))
