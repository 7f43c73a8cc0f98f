"""The console's page of flows (SPEC G2): per flow what waits and what holds slots, and its
busiest keys."""

from __future__ import annotations

from routemaster.console.views import PAGES, blueprint, render_page
from routemaster.service import flows
from routemaster.webcore.endpoints import OPEN, endpoint
from routemaster.webcore.extension import routemaster_app

BUSIEST = 10  # keys shown per flow


@blueprint.get("/flows")
@endpoint(
    OPEN, "The console: flows, their waiting labels and busiest keys", PAGES, tags=("console",)
)
def flows_page() -> str:
    app = routemaster_app()
    found = [
        {**flow, "keys": flows.busiest_keys(app, flow["name"], limit=BUSIEST) or []}
        for flow in flows.flow_list(app)
    ]
    return render_page("flows.html", flows=found, changes_url=None)
