"""The web application: the API and the console in one Flask app, made by :func:`create_app`.

There is no module-level Flask app. ``create_app`` attaches the given
:class:`~routemaster.app.App` (config, engine, settings) to the Flask app,
and handlers reach it through :func:`routemaster.webcore.extension.routemaster_app`.
It sits above both faces (:mod:`routemaster.api`, :mod:`routemaster.console`),
so neither imports the other's assembly.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import flask
from werkzeug.exceptions import NotFound

from routemaster import console
from routemaster.api import (
    bulk,
    changes,
    children,
    deliveries,
    explanations,
    flows,
    health,
    labels,
    machines,
    openapi,
    operations,
    plugins,
    receivers,
    subscriptions,
    tasks,
    versions,
)
from routemaster.api.auth import require_tokens
from routemaster.app import App
from routemaster.console.access import TOKEN_CHECK_KEY, console_token_check
from routemaster.console.views import error_page
from routemaster.hubs.changes import ChangeHub
from routemaster.webcore import error_responses
from routemaster.webcore.extension import EXTENSION_KEY, STARTED
from routemaster.webcore.paths import NameConverter, rewrite_path_info
from routemaster.webcore.request_checks import check_path
from routemaster.webcore.streams import HUB_KEY

CONSOLE_PREFIX = "/console/"

__all__ = ["create_app"]


class RoutemasterFlask(flask.Flask):
    """Flask, routing on the raw request path so ``%2F`` inside a name is not a separator.

    Every request, the four label requests included, is dispatched by Flask
    itself; what runs around each one is registered through Flask's
    documented hooks (the token check, the request metrics).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._synchronous: dict[Callable[..., Any], Callable[..., Any]] = {}

    def wsgi_app(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ[STARTED] = time.perf_counter()  # for the request metrics
        rewrite_path_info(environ)
        return super().wsgi_app(environ, start_response)

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Flask's answer, kept per function (Flask's documented override point).

        Flask asks again for the view and for every hook on every request,
        each time inspecting whether the function is a coroutine function.
        Only registered views, hooks and handlers come here: a bounded set.
        """
        known = self._synchronous.get(func)
        if known is None:
            known = self._synchronous[func] = super().ensure_sync(func)
        return known


def create_app(app: App) -> flask.Flask:
    # Named for the API's package, as before the console moved out: plugins see this name.
    flask_app = RoutemasterFlask("routemaster.api", static_folder=None)
    flask_app.config["MAX_CONTENT_LENGTH"] = app.settings.max_request_body
    # Unexpected errors reach got_request_exception and the JSON 500 handler, even when testing.
    flask_app.config["PROPAGATE_EXCEPTIONS"] = False
    flask_app.extensions[EXTENSION_KEY] = app
    hub = ChangeHub(app.db, app.settings, app.horizon)
    flask_app.extensions[HUB_KEY] = hub
    tasks.install(flask_app, app)
    flask_app.url_map.converters["name"] = NameConverter
    error_responses.register_error_handlers(flask_app)
    flask_app.register_error_handler(NotFound, _not_found)
    blueprints = [
        health.blueprint,
        machines.blueprint,
        versions.blueprint,
        labels.blueprint,
        children.blueprint,
        explanations.blueprint,
        operations.blueprint,
        deliveries.blueprint,
        receivers.blueprint,
        flows.blueprint,
        bulk.blueprint,
        openapi.blueprint,
        plugins.blueprint,
        changes.blueprint,
        subscriptions.blueprint,
        tasks.blueprint,
        console.blueprint,
    ]
    if app.metrics is not None:
        from routemaster.api import metrics  # imports prometheus_client: only when wanted

        blueprints.append(metrics.blueprint)
        metrics.instrument(flask_app, app, app.metrics)
    for blueprint in blueprints:
        flask_app.register_blueprint(blueprint)
    openapi.check_every_endpoint_is_declared(flask_app)
    if app.config.api.tokens_required:
        cache = require_tokens(flask_app, app)
        flask_app.extensions[TOKEN_CHECK_KEY] = console_token_check(cache)
    flask_app.before_request(check_path)  # after the token check: a 401 before a 400
    _forget_pooled_connections_after_fork(app, hub)
    app.hooks.init_flask(flask_app)
    if app.hooks.observe_requests:  # outermost, as in 1.x: around what init_flask added
        flask_app.wsgi_app = plugins.RequestHooks(  # type: ignore[method-assign]
            flask_app.wsgi_app, app.hooks
        )
    return flask_app


def _not_found(error: NotFound) -> Any:
    """A console address that matches no page (``/console/bulk/x``) is a page too; else JSON."""
    if flask.request.path.startswith(CONSOLE_PREFIX):
        return error_page(error)
    return error_responses.http_error(error)


def _forget_pooled_connections_after_fork(app: App, hub: ChangeHub) -> None:
    """Give each forked process (gunicorn worker) its own connections.

    A pooled connection inherited from the parent shares its socket with
    the parent; using it from two processes corrupts both sessions. After a
    fork the child drops (without closing) what it inherited and opens its
    own on first use; likewise the changes streams and their thread. Weak
    references so the hook does not keep old Apps alive.
    """
    reference = weakref.ref(app)
    hub_reference = weakref.ref(hub)

    def forget() -> None:
        inherited = reference()
        if inherited is not None:
            inherited.db.dispose(close=False)
            inherited.http.close()
            inherited.horizon.forget_after_fork()
        inherited_hub = hub_reference()
        if inherited_hub is not None:
            inherited_hub.forget_after_fork()

    os.register_at_fork(after_in_child=forget)
