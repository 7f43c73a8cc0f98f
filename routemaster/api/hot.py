"""Create, read, update and delete of one label, answered without Flask's per-request machinery.

These four requests are nearly all of the API's traffic. Through Flask each
one pays for a request and an application context, binding a URL adapter
and matching the rule table, a session, signals and hooks: in the profile
as much CPU as the label work itself (docs/performance.md). :class:`HotRoutes`
recognises the four by method and path shape and calls the same answer
functions the Flask views call (:mod:`routemaster.api.labels`), so the
responses are the same objects.

Hooks that must run around every request are registered with
:func:`before_request` / :func:`after_request`: each is a Flask hook and,
with the same function, a step of the direct dispatch, run in Flask's order.

The direct dispatch steps aside, returning ``None`` so Flask handles the
request, whenever Flask would do anything more: a hook registered any other
way or a signal receiver (a logging plugin's, say), a server name or trusted
hosts configured, another method (HEAD, OPTIONS, ...), a path that is not
exactly ``/state-machines/<sm>/labels/<label>``, or a name that does not
decode. An error raised by a view is answered by Flask's own error handling
inside a real request context, so error bodies, status codes, after-request
hooks and log lines are Flask's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import flask
from flask import signals
from werkzeug.routing import Rule

from routemaster.api import labels
from routemaster.api.paths import NameConverter
from routemaster.app import App

StartResponse = Callable[..., Any]
Before = Callable[[flask.Request], flask.Response | None]
After = Callable[[flask.Request, flask.Response], flask.Response]
Answer = Callable[[flask.Request | None, dict[str, Any], str, str], flask.Response]

HOOKS_KEY = "routemaster.direct_hooks"
BLUEPRINT = labels.blueprint.name  # the blueprint the four views belong to
# The view of each method on /state-machines/<sm>/labels/<label>.
_VIEWS = {
    "GET": labels.get_label,
    "POST": labels.create_label,
    "PATCH": labels.update_label,
    "DELETE": labels.delete_label,
}


@dataclass
class DirectHooks:
    """The hooks registered through this module: Flask's hook function -> the same step here."""

    before: dict[Callable[..., Any], Before] = field(default_factory=dict)
    after: dict[Callable[..., Any], After] = field(default_factory=dict)


def before_request(flask_app: flask.Flask, step: Before) -> None:
    """Run ``step(request)`` before every request; a response it returns is the answer."""

    def hook() -> flask.Response | None:
        return step(flask.request._get_current_object())  # type: ignore[attr-defined]

    flask_app.before_request(hook)
    _hooks(flask_app).before[hook] = step


def after_request(flask_app: flask.Flask, step: After) -> None:
    """Run ``step(request, response)`` on every response, errors included."""

    def hook(response: flask.Response) -> flask.Response:
        return step(flask.request._get_current_object(), response)  # type: ignore[attr-defined]

    flask_app.after_request(hook)
    _hooks(flask_app).after[hook] = step


def _hooks(flask_app: flask.Flask) -> DirectHooks:
    hooks: DirectHooks = flask_app.extensions.setdefault(HOOKS_KEY, DirectHooks())
    return hooks


class HotRoutes:
    """The direct dispatch of one Flask app; call it with each request before Flask."""

    def __init__(self, flask_app: flask.Flask, app: App) -> None:
        self._flask = flask_app
        self._app = app
        self._hooks = _hooks(flask_app)
        # The receivers of every signal Flask sends for a request (each a dict blinker keeps).
        self._receivers = [
            signal.receivers
            for signal in (
                signals.request_started,
                signals.request_finished,
                signals.request_tearing_down,
                signals.got_request_exception,
                signals.appcontext_pushed,
                signals.appcontext_popped,
                signals.appcontext_tearing_down,
            )
        ]
        self._decode = NameConverter(flask_app.url_map).to_python
        self._answers: dict[str, Answer] = {
            "GET": self._read,
            "POST": self._create,
            "PATCH": self._update,
            "DELETE": self._delete,
        }
        self._rules: dict[str, Rule] = {
            method: rule
            for rule in flask_app.url_map.iter_rules()
            for method in _VIEWS
            if flask_app.view_functions.get(rule.endpoint) is _VIEWS[method]
        }

    def __call__(
        self, environ: dict[str, Any], start_response: StartResponse
    ) -> Iterable[bytes] | None:
        """The response, or ``None`` when Flask must handle this request."""
        method = environ.get("REQUEST_METHOD", "")
        answer = self._answers.get(method)
        if answer is None:
            return None
        parts = environ.get("PATH_INFO", "").split("/")
        if (
            len(parts) != 5
            or parts[1] != "state-machines"
            or parts[3] != "labels"
            or not parts[2]
            or not parts[4]
        ):
            return None
        hooked = self._flask_would_only_dispatch()
        if hooked is None:
            return None
        self._flask._got_first_request = True  # as Flask's dispatch does
        try:
            sm, label = self._decode(parts[2]), self._decode(parts[4])
        except Exception:
            return None  # Flask answers it, after its hooks, as the routing error it is
        if not hooked:
            try:
                response = answer(None, environ, sm, label)
            except Exception as error:
                return self._answer_error(environ, start_response, error)
            return response(environ, start_response)
        return self._with_hooks(environ, start_response, method, answer, sm, label)

    def _with_hooks(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        method: str,
        answer: Answer,
        sm: str,
        label: str,
    ) -> Iterable[bytes]:
        """The steps of Flask's ``full_dispatch_request`` with the registered hooks."""
        request = self._request(environ)
        request.url_rule = self._rules[method]
        request.view_args = {"sm": sm, "label": label}
        try:
            response = None
            for hook in self._flask.before_request_funcs.get(None, ()):
                response = self._hooks.before[hook](request)
                if response is not None:
                    break
            if response is None:
                response = answer(request, environ, sm, label)
        except Exception as error:
            return self._answer_error(environ, start_response, error)
        try:
            for hook in reversed(self._flask.after_request_funcs.get(None, ())):
                response = self._hooks.after[hook](request, response)
        except Exception as error:  # past the view, as in Flask: an unhandled error
            return self._answer_error(environ, start_response, error, handled=False)
        return response(environ, start_response)

    def _flask_would_only_dispatch(self) -> bool | None:
        """``False`` while Flask would only route and call the view; ``True`` when it would
        also run hooks registered through this module; ``None`` when it would do more.

        Checked on every request (a hook may be added at any time), so kept to
        plain truth tests: the registries are empty dictionaries in the common case.
        """
        f = self._flask
        views = f.view_functions
        if (
            _any_for_labels(f.teardown_request_funcs)
            or _any_for_labels(f.url_value_preprocessors)
            or f.teardown_appcontext_funcs
            or any(self._receivers)
            or f.config["SERVER_NAME"] is not None
            or f.config["TRUSTED_HOSTS"] is not None
            or f.url_map.host_matching
            or views.get("labels.get_label") is not labels.get_label
            or views.get("labels.create_label") is not labels.create_label
            or views.get("labels.update_label") is not labels.update_label
            or views.get("labels.delete_label") is not labels.delete_label
        ):
            return None
        before, after = f.before_request_funcs, f.after_request_funcs
        if not _any_for_labels(before) and not _any_for_labels(after):
            return False
        if _only_known(before, self._hooks.before) and _only_known(after, self._hooks.after):
            return True
        return None

    def _request(self, environ: dict[str, Any]) -> flask.Request:
        request = self._flask.request_class(environ)
        request.max_content_length = self._flask.config["MAX_CONTENT_LENGTH"]
        return request

    def _create(
        self, request: flask.Request | None, environ: dict[str, Any], sm: str, label: str
    ) -> flask.Response:
        body = request if request is not None else self._request(environ)
        return labels.answer_create(self._app, body, sm, label)

    def _read(
        self, request: flask.Request | None, environ: dict[str, Any], sm: str, label: str
    ) -> flask.Response:
        return labels.answer_read(self._app, sm, label)

    def _update(
        self, request: flask.Request | None, environ: dict[str, Any], sm: str, label: str
    ) -> flask.Response:
        body = request if request is not None else self._request(environ)
        return labels.answer_update(self._app, body, sm, label)

    def _delete(
        self, request: flask.Request | None, environ: dict[str, Any], sm: str, label: str
    ) -> flask.Response:
        return labels.answer_delete(self._app, sm, label)

    def _answer_error(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        error: Exception,
        *,
        handled: bool = True,
    ) -> Iterable[bytes]:
        """What Flask answers when its view raises ``error``, step for step (``Flask.wsgi_app``).

        Called while ``error`` is being handled, as Flask's handlers expect (an
        unhandled one is re-raised with a bare ``raise``). ``handled=False``:
        an error Flask's dispatch would not have handled (an after-request hook's).
        """
        flask_app = self._flask
        context = flask_app.request_context(environ)
        failed: BaseException | None = None
        try:
            try:
                context.push()
                if not handled:
                    raise error
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


def _any_for_labels(registry: Mapping[Any, list[Any]]) -> bool:
    """Whether a label request gets any of these: the application's, or the labels blueprint's.

    Other blueprints' hooks (the console's) never run for it.
    """
    return bool(registry) and bool(registry.get(None) or registry.get(BLUEPRINT))


def _only_known(registry: Mapping[Any, list[Any]], known: Mapping[Any, Any]) -> bool:
    """The application's hooks are all ``known`` ones, and the labels blueprint has none."""
    return not registry.get(BLUEPRINT) and all(hook in known for hook in registry.get(None, ()))
