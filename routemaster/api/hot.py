"""Create, read, update and delete of one label, answered without Flask's per-request machinery.

These four requests are nearly all of the API's traffic. Through Flask each
one pays for a request and an application context, binding a URL adapter
and matching the rule table, a session, signals and hooks: in the profile
as much CPU as the label work itself (docs/performance.md). :class:`HotRoutes`
recognises the four by method and path shape and calls the same answer
functions the Flask views call (:mod:`routemaster.api.labels`), so the
responses are the same objects.

It steps aside, returning ``None`` so Flask handles the request, whenever
Flask would do anything more than route and call the view: a hook or a
signal receiver is registered (a logging plugin's, say), the app has a
server name or trusted hosts configured, the method is another one (HEAD,
OPTIONS, ...) or the path is not exactly ``/state-machines/<sm>/labels/<label>``.
An error is answered by Flask's own error handling inside a real request
context, so error bodies, status codes and log lines are Flask's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import flask
from flask import signals

from routemaster.api import labels
from routemaster.api.paths import NameConverter
from routemaster.app import App

StartResponse = Callable[..., Any]
Answer = Callable[[dict[str, Any], str, str], flask.Response]

# Endpoint of each method on /state-machines/<sm>/labels/<label>, as Flask routes it.
ENDPOINTS = {
    "GET": "labels.get_label",
    "POST": "labels.create_label",
    "PATCH": "labels.update_label",
    "DELETE": "labels.delete_label",
}
_VIEWS = {
    "labels.get_label": labels.get_label,
    "labels.create_label": labels.create_label,
    "labels.update_label": labels.update_label,
    "labels.delete_label": labels.delete_label,
}
_SIGNALS = (
    signals.request_started,
    signals.request_finished,
    signals.request_tearing_down,
    signals.got_request_exception,
    signals.appcontext_pushed,
    signals.appcontext_popped,
    signals.appcontext_tearing_down,
)


class HotRoutes:
    """The direct dispatch of one Flask app; call it with each request before Flask."""

    def __init__(self, flask_app: flask.Flask, app: App) -> None:
        self._flask = flask_app
        self._app = app
        self._decode = NameConverter(flask_app.url_map).to_python
        self._answers: dict[str, Answer] = {
            "GET": self._read,
            "POST": self._create,
            "PATCH": self._update,
            "DELETE": self._delete,
        }

    def __call__(
        self, environ: dict[str, Any], start_response: StartResponse
    ) -> Iterable[bytes] | None:
        """The response, or ``None`` when Flask must handle this request."""
        answer = self._answers.get(environ.get("REQUEST_METHOD", ""))
        if answer is None:
            return None
        parts = environ.get("PATH_INFO", "").split("/")
        if (
            len(parts) != 5
            or parts[1] != "state-machines"
            or parts[3] != "labels"
            or not parts[2]
            or not parts[4]
            or not self._flask_would_only_dispatch()
        ):
            return None
        try:
            response = answer(environ, self._decode(parts[2]), self._decode(parts[4]))
        except Exception as error:
            return self._answer_error(environ, start_response, error)
        return response(environ, start_response)

    def _flask_would_only_dispatch(self) -> bool:
        """True while Flask would do nothing for these requests but route and call the view."""
        f = self._flask
        return not (
            any(f.before_request_funcs.values())
            or any(f.after_request_funcs.values())
            or any(f.teardown_request_funcs.values())
            or any(f.url_value_preprocessors.values())
            or f.teardown_appcontext_funcs
            or any(signal.receivers for signal in _SIGNALS)
            or f.config["SERVER_NAME"] is not None
            or f.config["TRUSTED_HOSTS"] is not None
            or f.url_map.host_matching
            or any(f.view_functions.get(e) is not view for e, view in _VIEWS.items())
        )

    def _request(self, environ: dict[str, Any]) -> flask.Request:
        request = self._flask.request_class(environ)
        request.max_content_length = self._flask.config["MAX_CONTENT_LENGTH"]
        return request

    def _create(self, environ: dict[str, Any], sm: str, label: str) -> flask.Response:
        return labels.answer_create(self._app, self._request(environ), sm, label)

    def _read(self, environ: dict[str, Any], sm: str, label: str) -> flask.Response:
        return labels.answer_read(self._app, sm, label)

    def _update(self, environ: dict[str, Any], sm: str, label: str) -> flask.Response:
        return labels.answer_update(self._app, self._request(environ), sm, label)

    def _delete(self, environ: dict[str, Any], sm: str, label: str) -> flask.Response:
        return labels.answer_delete(self._app, sm, label)

    def _answer_error(
        self, environ: dict[str, Any], start_response: StartResponse, error: Exception
    ) -> Iterable[bytes]:
        """What Flask answers when its view raises ``error``, step for step (``Flask.wsgi_app``).

        Called while ``error`` is being handled, as Flask's handlers expect (an
        unhandled one is re-raised with a bare ``raise``).
        """
        flask_app = self._flask
        context = flask_app.request_context(environ)
        failed: BaseException | None = None
        try:
            try:
                context.push()
                response = flask_app.finalize_request(flask_app.handle_user_exception(error))
            except Exception as unhandled:
                failed = unhandled
                response = flask_app.handle_exception(unhandled)
            except BaseException as fatal:
                failed = fatal
                raise
            return response(environ, start_response)
        finally:
            if failed is not None and flask_app.should_ignore_error(failed):
                failed = None
            context.pop(failed)
