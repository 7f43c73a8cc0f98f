"""The state machines: the list, and each machine's graph with label counts per state."""

from __future__ import annotations

from typing import Any

import flask

from routemaster.auth import READ
from routemaster.config import describe_machine
from routemaster.service.reads import StateCount, state_counts
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.paths import link
from routemaster.webcore.request_checks import checked_query
from routemaster.webcore.responses import json_response

blueprint = flask.Blueprint("machines", __name__)


@blueprint.get("/state-machines")
@endpoint(READ, "The state machines", {200: Reply("MachineList")}, tags=("machines",))
def list_machines() -> flask.Response:
    checked_query()
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
    """The machine's graph (``describe_machine``), each state with its counts of live labels.

    ``label_counts`` and ``errored_counts`` also list states the config no
    longer has, if labels are still in them, so stranded labels are visible.
    """
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    counts = state_counts(app, machine.name)
    body: dict[str, Any] = describe_machine(machine)
    for state in body["states"]:
        count = counts.get(state["name"], StateCount(0, 0))
        state["labels"] = count.labels
        state["errored"] = count.errored
    body["label_counts"] = {name: count.labels for name, count in counts.items()}
    body["errored_counts"] = {
        name: count.errored for name, count in counts.items() if count.errored
    }
    labels = link("state-machines", machine.name, "labels")
    body["labels"] = labels
    body["errored_labels"] = labels + "?errored=true"
    body["changes"] = link("state-machines", machine.name, "changes")
    return json_response(body)
