"""The API's side of the logging plugins: per-request hooks and ``GET /check-loggers``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import flask
import werkzeug.exceptions
import werkzeug.routing

from routemaster.auth import OPERATE
from routemaster.hooks import Hooks
from routemaster.webcore.endpoints import Reply, endpoint

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

    As in 1.x, "finished" comes once the response body has been sent (or
    the server closed it early), with the status code as text, the headers
    and ``exc_info`` given to ``start_response``.

    The application is called at once, not from inside a generator, so its
    view has run when this returns: the server can see that the answer is a
    changes stream and hand its connection to the stream hub
    (:mod:`routemaster.server.handoff`). A stream handed off is "finished"
    for the plugins then: the request worker is done with it.
    """

    def __init__(self, wsgi_app: WSGIApp, hooks: Hooks) -> None:
        self.wsgi_app = wsgi_app
        self.hooks = hooks

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        sent: dict[str, Any] = {}

        def record(status: str, headers: Any, exc_info: Any = None) -> Any:
            sent.update(status=status.split()[0], headers=headers, exc_info=exc_info)
            return start_response(status, headers, exc_info)

        def finish() -> None:
            if sent:
                self.hooks.request_finished(environ, **sent)
                sent.clear()  # once, however often the body is closed

        self.hooks.request_started(environ)
        try:
            body = self.wsgi_app(environ, record)
        except BaseException:
            finish()
            raise
        return _Finishing(body, finish)


class _Finishing:
    """A response body that calls ``finish`` once it has been sent, or closed unsent."""

    def __init__(self, body: Iterable[bytes], finish: Callable[[], None]) -> None:
        self._body = body
        self._finish = finish

    def __iter__(self) -> Iterator[bytes]:
        yield from self._body
        self._finish()

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._finish()
