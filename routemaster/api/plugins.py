"""The API's side of the logging plugins: per-request hooks and ``GET /check-loggers``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import flask
import werkzeug.exceptions
import werkzeug.routing

from routemaster.api.endpoints import Reply, endpoint
from routemaster.auth import OPERATE
from routemaster.hooks import Hooks

blueprint = flask.Blueprint("plugins", __name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def provide_legacy_names() -> None:
    """Names 1.x plugins import from where old Werkzeug had them (harmless aliases).

    ``routemaster-prometheus`` and ``routemaster-statsd`` import ``NotFound``
    and ``MethodNotAllowed`` from ``werkzeug.routing``, which Werkzeug 2.2
    stopped re-exporting; they are the same classes as in ``werkzeug.exceptions``.
    Called before any plugin is imported.
    """
    for name in ("NotFound", "MethodNotAllowed"):
        if not hasattr(werkzeug.routing, name):
            setattr(werkzeug.routing, name, getattr(werkzeug.exceptions, name))


class LoggerCheckError(Exception):
    """Raised on purpose by ``GET /check-loggers``."""


@blueprint.get("/check-loggers")
@endpoint(
    OPERATE,
    "Fail on purpose (500), to see that error reporting works",
    {500: Reply("Error", description="Always")},
    tags=("service",),
)
def check_loggers() -> flask.Response:
    """Fail on purpose, as 1.x does, so operators can see their error reporting work."""
    raise LoggerCheckError("Test exception: GET /check-loggers fails on purpose")


class RequestHooks:
    """WSGI middleware: ``process_request_started`` before, ``process_request_finished`` after.

    As in 1.x, "finished" comes once the response body has been sent, with
    the status code as text, the headers and ``exc_info`` given to
    ``start_response``.
    """

    def __init__(self, wsgi_app: WSGIApp, hooks: Hooks) -> None:
        self.wsgi_app = wsgi_app
        self.hooks = hooks

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterator[bytes]:
        sent: dict[str, Any] = {}

        def record(status: str, headers: Any, exc_info: Any = None) -> Any:
            sent.update(status=status.split()[0], headers=headers, exc_info=exc_info)
            return start_response(status, headers, exc_info)

        self.hooks.request_started(environ)
        body = self.wsgi_app(environ, record)
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            if sent:
                self.hooks.request_finished(environ, **sent)
