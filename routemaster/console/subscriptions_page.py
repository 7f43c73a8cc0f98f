"""The console's page of push subscriptions and their lag (for tokens with ``admin``)."""

from __future__ import annotations

import flask
from werkzeug.exceptions import Forbidden

from routemaster.auth import ADMIN
from routemaster.console.views import PAGES, blueprint, render_page
from routemaster.service.subscriptions import all_subscriptions
from routemaster.webcore.endpoints import OPEN, endpoint
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.responses import subscription_json


@blueprint.get("/subscriptions")
@endpoint(OPEN, "The console: push subscriptions and their lag", PAGES, tags=("console",))
def subscriptions_page() -> str:
    if not flask.g.access.may(ADMIN):
        raise Forbidden("Subscriptions are shown to tokens with the admin scope.")
    found = [subscription_json(entry) for entry in all_subscriptions(routemaster_app())]
    return render_page("subscriptions.html", subscriptions=found, changes_url=None)
