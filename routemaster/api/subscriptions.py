"""Push subscriptions (SPEC D2): ``/subscriptions``, every endpoint under the ``admin`` scope.

A subscription is a URL the workers POST batches of changes to, and a cursor
on the changes stream. Here they are created, replaced, read, deleted and
rewound; the sending is the worker's (:mod:`routemaster.worker.subscription_sender`).
"""

from __future__ import annotations

import re
from typing import Any

import flask
from werkzeug.exceptions import NotFound

from routemaster.app import App
from routemaster.auth import ADMIN
from routemaster.service import subscriptions as service
from routemaster.service.subscriptions import (
    ForbiddenDestination,
    Invalid,
    Position,
    Shown,
    SubscriptionSettings,
    check_destination,
)
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.request_checks import InvalidRequest, checked_body
from routemaster.webcore.responses import json_response, subscription_json

blueprint = flask.Blueprint("subscriptions", __name__)

SUBSCRIPTION = "/subscriptions/<name>"
NAME = re.compile(r"[A-Za-z0-9_.~-]{1,200}")
NAME_SCHEMA = {
    "type": "string",
    "pattern": f"^{NAME.pattern}$",
    "not": {"enum": [".", ".."]},
    "description": "1 to 200 of A-Z a-z 0-9 _ . ~ - (and not . or ..).",
    "x-error": "A subscription's name is 1 to 200 of A-Z a-z 0-9 _ . ~ - (and not . or ..).",
}
DEFAULT_MAX_EVENTS = 100
DEFAULT_BATCH_DELAY_MS = 500
MAX_XID8 = 2**63 - 1

ERRORS = {400: Reply("Error"), 404: Reply("Error")}


@blueprint.errorhandler(Invalid)
def _invalid(error: Invalid) -> flask.Response:
    return json_response({"message": str(error), "reason": error.reason}, 400)


@blueprint.errorhandler(InvalidRequest)
def _outside_the_document(error: InvalidRequest) -> flask.Response:
    reason = (
        "invalid_cursor"
        if error.field == "after"
        else "invalid_name"
        if error.field == "name"
        else "invalid_url"
        if (error.field, error.rule) == ("url", "pattern")
        else "invalid"
    )
    return json_response({"message": error.description, "reason": reason}, 400)


@blueprint.get("/subscriptions")
@endpoint(
    ADMIN,
    "Every push subscription, with its lag",
    {200: Reply("SubscriptionList")},
    tags=("subscriptions",),
)
def list_subscriptions() -> flask.Response:
    found = [subscription_json(entry) for entry in service.all_subscriptions(routemaster_app())]
    return json_response({"subscriptions": found})


@blueprint.put(SUBSCRIPTION)
@endpoint(
    ADMIN,
    "Create or replace a push subscription (replacing keeps its cursor)",
    {
        200: Reply("Subscription"),
        201: Reply("Subscription", description="Created"),
        **ERRORS,
        400: Reply(
            "Error",
            description="Outside this document, or refused by the configuration: a url inside "
            "the network, a state machine it lacks, an after ahead of the stream",
        ),
    },
    body="SubscriptionBody",
    tags=("subscriptions",),
    path={"name": NAME_SCHEMA},
)
def put_subscription(name: str) -> flask.Response:
    app = routemaster_app()
    settings, after = _settings(app, checked_body())
    stored, created = service.put_subscription(app, name, settings, after=after)
    return json_response(subscription_json(stored), 201 if created else 200)


@blueprint.get(SUBSCRIPTION)
@endpoint(
    ADMIN,
    "A push subscription, with its lag",
    {200: Reply("Subscription"), **ERRORS},
    tags=("subscriptions",),
    path={"name": NAME_SCHEMA},
)
def get_subscription(name: str) -> flask.Response:
    app = routemaster_app()
    return json_response(subscription_json(_found(service.get_subscription(app, name), name)))


@blueprint.delete(SUBSCRIPTION)
@endpoint(
    ADMIN,
    "Delete a push subscription (a batch in flight is dropped)",
    {204: Reply(None), **ERRORS},
    tags=("subscriptions",),
    path={"name": NAME_SCHEMA},
)
def delete_subscription(name: str) -> flask.Response:
    app = routemaster_app()
    if not service.delete_subscription(app, name):
        raise NotFound(f"No subscription called {name!r}.")
    return flask.Response(status=204)


@blueprint.post(SUBSCRIPTION + "/cursor")
@endpoint(
    ADMIN,
    "Replay from a stream position (supersedes the batch in flight)",
    {
        200: Reply("Subscription"),
        **ERRORS,
        400: Reply("Error", description="Outside this document, or after is ahead of the stream"),
    },
    body="Cursor",
    tags=("subscriptions",),
    path={"name": NAME_SCHEMA},
)
def set_cursor(name: str) -> flask.Response:
    app = routemaster_app()
    after = _position(checked_body()["after"])
    return json_response(subscription_json(_found(service.set_cursor(app, name, after), name)))


def _found(entry: Shown | None, name: str) -> Shown:
    if entry is None:
        raise NotFound(f"No subscription called {name!r}.")
    return entry


def _settings(app: App, body: dict[str, Any]) -> tuple[SubscriptionSettings, Position | None]:
    """The subscription a body (checked against ``SubscriptionBody``) asks for."""
    url: str = body["url"]
    try:
        check_destination(app, url)
    except ForbiddenDestination as refused:
        raise Invalid(f'"url": {refused}.', refused.reason) from None
    machines = body.get("state_machines")
    if machines is not None:
        known = {machine.name for machine in app.config.state_machines}
        for machine in machines:
            if machine not in known:
                raise Invalid(f'"state_machines": no state machine called {machine!r}.')
        machines = tuple(dict.fromkeys(machines))
    after = body.get("after")
    settings = SubscriptionSettings(
        url=url,
        state_machines=machines,
        max_events=body.get("max_events", DEFAULT_MAX_EVENTS),
        batch_delay_ms=body.get("batch_delay_ms", DEFAULT_BATCH_DELAY_MS),
        signing_secret_env=body.get("signing_secret_env"),
    )
    return settings, None if after is None else _position(after)


def _position(value: str) -> Position:
    """A position checked by the schema's pattern, within the stream's range."""
    position = Position.parse(value)
    if position.xact > MAX_XID8 or position.id > MAX_XID8:
        raise Invalid(f'"after": {value[:40]!r} is out of range.', "invalid_cursor")
    return position
