"""With ``api: {authentication: tokens}``: streams need ``read``; the console signs in by cookie."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.api.auth import token_cache
from routemaster.app import App, Settings
from routemaster.auth.admin import revoke_token
from routemaster.config import load_config
from routemaster.console.access import TOKEN_COOKIE
from tests.api.conftest import CONFIG_PATH
from tests.api.tokens import secured_api, token_secret, tokens_layer

LABEL = "/state-machines/user/labels/ann"


@pytest.fixture
def secured(db_engine: sa.Engine, tmp_path: Path) -> Iterator[flask.Flask]:
    app = App(
        config=load_config([CONFIG_PATH, tokens_layer(tmp_path)]),
        db=db_engine,
        settings=Settings(token_use_interval=3600),
    )
    with secured_api(app) as flask_app:
        yield flask_app


@pytest.fixture
def client(secured: flask.Flask) -> FlaskClient:
    return secured.test_client()


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match
    return match[1]


def _sign_in(client: FlaskClient, secret: str) -> int:
    token = _csrf(client.get("/console/login").get_data(as_text=True))
    return client.post("/console/login", data={"csrf": token, "token": secret}).status_code


def test_streams_need_a_token_with_read(client: FlaskClient, db_engine: sa.Engine) -> None:
    assert client.get("/changes").status_code == 401
    writer = token_secret(db_engine, "writer", "write")
    refused = client.get("/changes", headers={"Authorization": f"Bearer {writer}"})
    assert refused.status_code == 403
    assert "read" in refused.get_json()["message"]
    reader = token_secret(db_engine, "reader", "read")
    allowed = client.head(
        "/state-machines/user/changes", headers={"Authorization": f"Bearer {reader}"}
    )
    assert allowed.status_code == 200
    assert allowed.mimetype == "text/event-stream"


def test_the_console_signs_in_with_an_api_token(client: FlaskClient, db_engine: sa.Engine) -> None:
    operator = token_secret(db_engine, "operator", "read", "write", "operate")
    client.post(LABEL, json={"metadata": {}}, headers={"Authorization": f"Bearer {operator}"})
    assert client.get("/console/").status_code == 302  # no bearer header from a browser
    assert _sign_in(client, "rm_not_a_token") == 401
    assert _sign_in(client, operator) == 303
    cookie = client.get_cookie(TOKEN_COOKIE, path="/console/")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Strict"
    page = client.get("/console/machines/user/labels/ann")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "/ann/pause" in html
    paused = client.post("/console/machines/user/labels/ann/pause", data={"csrf": _csrf(html)})
    assert paused.status_code == 303
    label = client.get(LABEL, headers={"Authorization": f"Bearer {operator}"}).get_json()
    assert label["paused"] is True
    assert client.head("/console/changes").status_code == 200  # the pages' stream, by cookie


def test_a_reading_token_has_no_buttons_and_revoking_it_signs_out(
    client: FlaskClient, secured: flask.Flask, db_engine: sa.Engine
) -> None:
    operator = token_secret(db_engine, "operator", "read", "write")
    client.post(LABEL, json={"metadata": {}}, headers={"Authorization": f"Bearer {operator}"})
    reader = token_secret(db_engine, "reader", "read")
    assert _sign_in(client, reader) == 303
    html = client.get("/console/machines/user/labels/ann").get_data(as_text=True)
    assert "/ann/pause" not in html
    refused = client.post("/console/machines/user/labels/ann/pause", data={"csrf": _csrf(html)})
    assert refused.status_code == 403
    revoke_token(db_engine, "reader", wait=10, direct=db_engine)
    cache = token_cache(secured)
    assert cache is not None and cache.wait_until_current(10)
    assert client.get("/console/").status_code == 302


def test_the_subscriptions_page_needs_admin(client: FlaskClient, db_engine: sa.Engine) -> None:
    assert _sign_in(client, token_secret(db_engine, "reader", "read")) in (302, 303)
    assert client.get("/console/subscriptions").status_code == 403
    assert "Subscriptions" not in client.get("/console/").get_data(as_text=True)
    assert _sign_in(client, token_secret(db_engine, "administrator", "read", "admin")) in (302, 303)
    assert client.get("/console/subscriptions").status_code == 200
