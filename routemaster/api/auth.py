"""Bearer tokens on the API (``api: {authentication: tokens}``): 401, 403, or through.

Each handler declares its scope with :func:`~routemaster.webcore.endpoints.endpoint`;
this check, run before every request, reads it from the matched route. A
route nobody declared (a logging plugin's) needs ``read`` for safe methods
and ``operate`` otherwise; a path that matches no route needs any valid
token before it gets its 404, so the API's shape is not open to probing.

Secrets are checked against :class:`~routemaster.auth.cache.TokenCache`
(memory, no database round trip) and never logged.
"""

from __future__ import annotations

import flask

from routemaster.app import App
from routemaster.auth import OPERATE, READ
from routemaster.auth.cache import Token, TokenCache
from routemaster.webcore.endpoints import CAPABILITY, OPEN, declared
from routemaster.webcore.responses import json_response

CACHE_KEY = "routemaster.tokens"
TOKEN_KEY = "routemaster.token"  # in the WSGI environ: who the request is authenticated as
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DESCRIBING_METHODS = frozenset({"HEAD", "OPTIONS"})
_CHALLENGE = 'Bearer realm="routemaster"'


def require_tokens(flask_app: flask.Flask, app: App) -> TokenCache:
    """Check a bearer token before every request; the cache that checks them."""
    cache = TokenCache(
        app.db,
        direct=app.direct,
        record_every=app.settings.token_use_interval,
        poll_every=app.settings.poll_interval,
        on_listening=None if app.metrics is None else app.metrics.listening("tokens"),
    )
    flask_app.extensions[CACHE_KEY] = cache

    def check() -> flask.Response | None:
        request = flask.request._get_current_object()  # type: ignore[attr-defined]
        return check_token(flask_app, cache, request)

    flask_app.before_request(check)
    cache.start()  # listening from the start, so `token revoke` hears from this process
    return cache


def token_cache(flask_app: flask.Flask) -> TokenCache | None:
    """The app's cache, when it requires tokens (tests close it; the console may use it)."""
    cache: TokenCache | None = flask_app.extensions.get(CACHE_KEY)
    return cache


def current_token() -> Token | None:
    """Who the current request is authenticated as (``None`` when tokens are off)."""
    token: Token | None = flask.request.environ.get(TOKEN_KEY)
    return token


def required_scope(flask_app: flask.Flask, request: flask.Request) -> str | None:
    """The scope the request needs; ``None`` for an open endpoint or an unknown path."""
    if request.url_rule is None:
        return None
    view = flask_app.view_functions.get(request.url_rule.endpoint)
    declaration = declared(view)
    if declaration is None:
        return READ if request.method in SAFE_METHODS else OPERATE
    if declaration.scope is not OPEN and request.method in DESCRIBING_METHODS:
        return READ  # HEAD and OPTIONS of any endpoint only describe it
    return declaration.scope


def check_token(
    flask_app: flask.Flask, cache: TokenCache, request: flask.Request
) -> flask.Response | None:
    """``None`` to let the request through, else the 401 or 403 that answers it."""
    scope = required_scope(flask_app, request)
    if scope is OPEN and request.url_rule is not None:
        return None
    secret = _bearer(request.headers.get("Authorization", ""))
    if secret is None and scope == CAPABILITY:
        return None  # the id in the path is the permission
    if secret is None:
        return _unauthorized("This endpoint needs a token: send 'Authorization: Bearer TOKEN'.")
    token = cache.authenticate(secret)
    if token is None:
        return _unauthorized("The token is not valid (unknown or revoked).", invalid=True)
    if scope is not None and scope != CAPABILITY and scope not in token.scopes:
        return _lacks(token, scope)
    request.environ[TOKEN_KEY] = token
    return None


def require_scope(flask_app: flask.Flask, scope: str, why: str) -> flask.Response | None:
    """In a handler whose scope depends on its body (``scope_with``): ``None`` if tokens are
    off or the request's token has ``scope``, else the 401 or 403 that answers it."""
    if token_cache(flask_app) is None:
        return None
    token = current_token()
    if token is None:
        return _unauthorized(f"{why} needs a token: send 'Authorization: Bearer TOKEN'.")
    return None if scope in token.scopes else _lacks(token, scope)


def _lacks(token: Token, scope: str) -> flask.Response:
    return json_response(
        {"message": f"The token {token.name!r} lacks the {scope!r} scope this needs."},
        403,
        {"WWW-Authenticate": f'{_CHALLENGE}, error="insufficient_scope", scope="{scope}"'},
    )


def _bearer(header: str) -> str | None:
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    return secret if scheme.lower() == "bearer" and secret else None


def _unauthorized(message: str, *, invalid: bool = False) -> flask.Response:
    challenge = _CHALLENGE + (', error="invalid_token"' if invalid else "")
    return json_response({"message": message}, 401, {"WWW-Authenticate": challenge})
