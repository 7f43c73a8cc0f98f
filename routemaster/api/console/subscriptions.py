"""The console's page of push subscriptions and their lag (for tokens with ``admin``)."""

from __future__ import annotations

import flask
from werkzeug.exceptions import Forbidden

from routemaster.api.console.views import PAGES, blueprint, render_page
from routemaster.api.endpoints import OPEN, endpoint
from routemaster.api.extension import routemaster_app
from routemaster.api.subscriptions import shown
from routemaster.auth import ADMIN
from routemaster.db import subscriptions as store


@blueprint.get("/subscriptions")
@endpoint(OPEN, "The console: push subscriptions and their lag", PAGES, tags=("console",))
def subscriptions_page() -> str:
    if not flask.g.access.may(ADMIN):
        raise Forbidden("Subscriptions are shown to tokens with the admin scope.")
    app = routemaster_app()
    with app.db.connect() as conn:
        found = [shown(conn, subscription) for subscription in store.all_subscriptions(conn)]
    return render_page("subscriptions.html", subscriptions=found, changes_url=None)
