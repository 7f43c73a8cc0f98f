"""Who may do what in the console, and the CSRF check for its buttons.

With ``authentication: none`` (the default, as in 1.x) the console reads and
operates like the API does: anyone who reaches it may. With tokens, a person
signs in with a token once; it is kept in a cookie the browser never lets a
script or another site use (``HttpOnly``, ``SameSite=Strict``), and each
request checks it again, so a revoked token stops working at once.

The token check is a callable from a secret to its scopes (``None`` for an
unknown or revoked secret), stored in the Flask app's extensions under
:data:`TOKEN_CHECK_KEY` when ``api: {authentication: tokens}`` is on (see
:func:`console_token_check`: the API's own token cache). Without one,
authentication is off. The API's bearer check leaves the console's routes to
this one: browsers do not send ``Authorization`` headers.

Every button is a form POST carrying a CSRF token that must match a cookie
of the same value (double submit); a cross-site page can read neither. A
POST whose ``Origin`` names another host is refused too.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import flask
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from routemaster.auth.cache import TokenCache

SCOPES = frozenset({"read", "write", "operate", "admin"})
TOKEN_COOKIE = "routemaster_console"
CSRF_COOKIE = "routemaster_csrf"
CSRF_FIELD = "csrf"
TOKEN_CHECK_KEY = "routemaster.console.token_check"

TokenCheck = Callable[[str], frozenset[str] | None]


@dataclass(frozen=True)
class Access:
    scopes: frozenset[str]
    signed_in: bool  # through a token (authentication is on)

    def may(self, scope: str) -> bool:
        return scope in self.scopes


def console_token_check(cache: TokenCache) -> TokenCheck:
    """The console's check on the API's token cache: the same tokens, revoked as quickly."""

    def scopes(secret: str) -> frozenset[str] | None:
        token = cache.authenticate(secret)
        return None if token is None else token.scopes

    return scopes


def token_check() -> TokenCheck | None:
    check: TokenCheck | None = flask.current_app.extensions.get(TOKEN_CHECK_KEY)
    return check


def current_access() -> Access | None:
    """What this request may do; ``None`` when it must sign in first."""
    check = token_check()
    if check is None:
        return Access(SCOPES, signed_in=False)
    secret = flask.request.cookies.get(TOKEN_COOKIE)
    if not secret:
        return None
    scopes = check(secret)
    return None if scopes is None else Access(frozenset(scopes), signed_in=True)


def sign_in(response: Response, secret: str) -> None:
    response.set_cookie(
        TOKEN_COOKIE,
        secret,
        httponly=True,
        samesite="Strict",
        secure=flask.request.is_secure,
        path="/console/",
    )


def sign_out(response: Response) -> None:
    response.delete_cookie(TOKEN_COOKIE, path="/console/", samesite="Strict", httponly=True)


def csrf_token() -> str:
    """This browser's CSRF token (made on first use, and set as a cookie after the request)."""
    token = flask.g.get("csrf_token") or flask.request.cookies.get(CSRF_COOKIE)
    if not token:
        token = secrets.token_urlsafe(32)
        flask.g.new_csrf_token = token
    flask.g.csrf_token = token
    return str(token)


def remember_csrf_token(response: Response) -> None:
    token = flask.g.get("new_csrf_token")
    if token:
        response.set_cookie(
            CSRF_COOKIE,
            token,
            httponly=True,
            samesite="Strict",
            secure=flask.request.is_secure,
            path="/console/",
        )


def check_csrf() -> None:
    """403 unless the form's token matches the cookie and the POST comes from this host."""
    sent = flask.request.form.get(CSRF_FIELD, "")
    expected = flask.request.cookies.get(CSRF_COOKIE, "")
    if not (sent and expected and hmac.compare_digest(sent, expected)):
        raise Forbidden("The form is stale or came from another site; reload the page and retry.")
    origin = flask.request.headers.get("Origin")
    if origin and origin != "null" and urlsplit(origin).netloc != flask.request.host:
        raise Forbidden("Console buttons only work from the console's own pages.")
