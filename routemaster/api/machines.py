"""The state machines: the list, and each machine's graph with label counts per state."""

from __future__ import annotations

from typing import Any

import flask

from routemaster.api.bodies import check_query
from routemaster.api.endpoints import Reply, endpoint
from routemaster.api.extension import machine_or_404, routemaster_app
from routemaster.api.paths import link
from routemaster.api.responses import json_response
from routemaster.auth import READ
from routemaster.config import describe_machine
from routemaster.db.listings import label_counts

blueprint = flask.Blueprint("machines", __name__)


@blueprint.get("/state-machines")
@endpoint(READ, "The state machines", {200: Reply("MachineList")}, tags=("machines",))
def list_machines() -> flask.Response:
    check_query(())
    machines = routemaster_app().config.state_machines
    return json_response(
        {
            "state-machines": [
                {"name": machine.name, "labels": link("state-machines", machine.name, "labels")}
                for machine in machines
            ]
        }
    )


@blueprint.get("/state-machines/<name:sm>")
@endpoint(
    READ,
    "A machine's graph, with label counts per state",
    {200: Reply("Machine"), 404: Reply("Error")},
    tags=("machines",),
)
def describe(sm: str) -> flask.Response:
    """The machine's graph (``describe_machine``), each state with its count of live labels.

    ``label_counts`` also lists states the config no longer has, if labels
    are still in them, so stranded labels are visible.
    """
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    counts = label_counts(app.db, machine.name)
    body: dict[str, Any] = describe_machine(machine)
    for state in body["states"]:
        state["labels"] = counts.get(state["name"], 0)
    body["label_counts"] = counts
    body["labels"] = link("state-machines", machine.name, "labels")
    return json_response(body)
