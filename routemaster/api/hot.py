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

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import flask
from flask import signals

from routemaster.api import labels
from routemaster.api.paths import NameConverter
from routemaster.app import App

StartResponse = Callable[..., Any]
Answer = Callable[[dict[str, Any], str, str], flask.Response]


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
        """True while Flask would do nothing for these requests but route and call the view.

        Checked on every request (a hook may be added at any time), so kept to
        plain truth tests: the registries are empty dictionaries in the common case.
        """
        f = self._flask
        views = f.view_functions
        return not (
            _any_registered(f.before_request_funcs)
            or _any_registered(f.after_request_funcs)
            or _any_registered(f.teardown_request_funcs)
            or _any_registered(f.url_value_preprocessors)
            or f.teardown_appcontext_funcs
            or signals.request_started.receivers
            or signals.request_finished.receivers
            or signals.request_tearing_down.receivers
            or signals.got_request_exception.receivers
            or signals.appcontext_pushed.receivers
            or signals.appcontext_popped.receivers
            or signals.appcontext_tearing_down.receivers
            or f.config["SERVER_NAME"] is not None
            or f.config["TRUSTED_HOSTS"] is not None
            or f.url_map.host_matching
            or views.get("labels.get_label") is not labels.get_label
            or views.get("labels.create_label") is not labels.create_label
            or views.get("labels.update_label") is not labels.update_label
            or views.get("labels.delete_label") is not labels.delete_label
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


def _any_registered(registry: Mapping[Any, list[Any]]) -> bool:
    return bool(registry) and any(registry.values())
