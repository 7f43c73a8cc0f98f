"""The API with bearer tokens required (``api: {authentication: tokens}``), and tokens for it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import flask
import sqlalchemy as sa

from routemaster.api.auth import token_cache
from routemaster.app import App
from routemaster.auth.admin import create_token
from routemaster.web import create_app
from tests.api.openapi_check import CheckedClient
from tests.pooler import pooled_run

TOKENS = "api:\n  authentication: tokens\n"


def tokens_layer(tmp_path: Path) -> Path:
    """A configuration layer that turns tokens on."""
    layer = tmp_path / "tokens.yaml"
    layer.write_text(TOKENS)
    return layer


@contextmanager
def secured_api(app: App) -> Iterator[flask.Flask]:
    """The API of ``app`` (tokens on) once its token cache is current; responses are checked
    against the OpenAPI document. In a direct run its token cache listens on ``app.db``."""
    if app.direct is None and not pooled_run():
        app.direct = app.db
    flask_app = create_app(app)
    flask_app.test_client_class = CheckedClient
    cache = token_cache(flask_app)
    assert cache is not None and cache.wait_until_current(10)
    try:
        yield flask_app
    finally:
        cache.close()


def token_secret(db_engine: sa.Engine, name: str, *scopes: str) -> str:
    """A new token with ``scopes``, known to every process that listens; its secret."""
    direct = None if pooled_run() else db_engine
    secret, confirmation = create_token(db_engine, name, set(scopes), wait=10, direct=direct)
    assert confirmation.complete
    return str(secret.secret)


def bearer(db_engine: sa.Engine, *scopes: str, name: str | None = None) -> dict[str, str]:
    """The headers that present a new token with ``scopes`` (named after them by default)."""
    secret = token_secret(db_engine, name or "-".join(scopes) or "none", *scopes)
    return {"Authorization": f"Bearer {secret}"}
