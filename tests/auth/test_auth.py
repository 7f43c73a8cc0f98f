"""Bearer tokens (``api: {authentication: tokens}``): 401, 403, scopes, revocation, last use."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.api.auth import token_cache
from routemaster.app import App, Settings
from routemaster.auth.admin import list_tokens, revoke_token
from routemaster.config import load_config
from routemaster.logging import PythonLogger
from routemaster.metrics import Metrics
from tests.api.conftest import CONFIG_PATH
from tests.api.helpers import body
from tests.api.tokens import bearer as headers_for
from tests.api.tokens import secured_api, tokens_layer

LABELS = "/state-machines/user/labels"
LABEL = LABELS + "/ann"


@pytest.fixture
def secured(db_engine: sa.Engine, tmp_path: Path) -> Iterator[flask.Flask]:
    """The API with tokens required (and metrics on, for the open /metrics)."""
    app = App(
        config=load_config([CONFIG_PATH, tokens_layer(tmp_path)]),
        db=db_engine,
        settings=Settings(token_use_interval=3600),  # written only when asked, below
        metrics=Metrics(),
        loggers=(PythonLogger(log_level="DEBUG"),),
    )
    with secured_api(app) as flask_app:
        yield flask_app


@pytest.fixture
def client(secured: flask.Flask) -> FlaskClient:
    return secured.test_client()


Bearer = Callable[..., dict[str, str]]


@pytest.fixture
def bearer(db_engine: sa.Engine) -> Bearer:
    """Make a token with the given scopes; the headers that present it."""

    def make(*scopes: str, name: str | None = None) -> dict[str, str]:
        return headers_for(db_engine, *scopes, name=name)

    return make


def test_health_and_metrics_need_no_token(client: FlaskClient) -> None:
    assert client.get("/").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert b"routemaster_http_requests_total" in metrics.data


def test_no_token_is_401_with_a_bearer_challenge(client: FlaskClient) -> None:
    for method, path in [("GET", "/state-machines"), ("POST", LABEL), ("POST", LABEL + "/retry")]:
        response = client.open(path, method=method, json={"metadata": {}})
        assert response.status_code == 401, (method, path)
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="routemaster"'
        assert "Authorization: Bearer" in body(response)["message"]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer rm_0123456789abcdef_" + "A" * 43,  # well formed, unknown
        "Bearer not-a-token",
        "bearer rm_0123456789abcdef_" + "A" * 43,
    ],
)
def test_an_unknown_token_is_401_invalid_token(
    client: FlaskClient, bearer: Bearer, header: str
) -> None:
    bearer("read")
    response = client.get("/state-machines", headers={"Authorization": header})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    assert body(response)["message"] == "The token is not valid (unknown or revoked)."


def test_another_scheme_is_no_token(client: FlaskClient) -> None:
    response = client.get("/state-machines", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="routemaster"'


def test_a_token_without_the_scope_is_403(client: FlaskClient, bearer: Bearer) -> None:
    reader = bearer("read")
    response = client.post(LABEL, json={"metadata": {}}, headers=reader)
    assert response.status_code == 403
    assert body(response)["message"] == "The token 'read' lacks the 'write' scope this needs."
    assert 'error="insufficient_scope", scope="write"' in response.headers["WWW-Authenticate"]


def test_each_scope_opens_exactly_its_endpoints(client: FlaskClient, bearer: Bearer) -> None:
    read, write, operate = bearer("read"), bearer("write"), bearer("operate")

    def status(method: str, path: str, headers: dict[str, str], **kwargs: Any) -> int:
        return client.open(path, method=method, headers=headers, **kwargs).status_code

    assert status("POST", LABEL, write, json={"metadata": {}}) == 201
    assert status("PATCH", LABEL, write, json={"metadata": {"a": 1}}) == 200
    reads = [
        "/state-machines",
        "/state-machines/user",
        LABELS,
        LABELS + "?limit=10",
        LABEL,
        LABEL + "/history",
        LABEL + "/explain",
        "/openapi.json",
    ]
    for path in reads:
        assert status("GET", path, read) == 200, path
        assert status("GET", path, write) == 403, path
        assert status("GET", path, operate) == 403, path
    for command in ("pause", "resume"):
        assert status("POST", f"{LABEL}/{command}", read) == 403
        assert status("POST", f"{LABEL}/{command}", write) == 403
        assert status("POST", f"{LABEL}/{command}", operate, json={"reason": "t"}) == 200
    move = {"state": "review", "reason": "test"}
    assert status("POST", LABEL + "/move", write, json=move) == 403
    assert status("POST", LABEL + "/move", operate, json=move) == 200
    assert status("POST", LABEL + "/retry", operate) == 409  # through: not errored
    assert status("POST", LABELS + "/bob", read, json={"metadata": {}}) == 403
    assert status("DELETE", LABEL, operate) == 403
    assert status("DELETE", LABEL, write) == 204


def test_unknown_paths_need_a_token_before_their_404(client: FlaskClient, bearer: Bearer) -> None:
    assert client.get("/no/such/thing").status_code == 401
    assert client.get("/no/such/thing", headers=bearer("write")).status_code == 404


def test_a_new_token_works_and_a_revoked_one_stops_at_once(
    client: FlaskClient, db_engine: sa.Engine, bearer: Bearer
) -> None:
    headers = bearer("read", name="ci")
    assert client.get("/state-machines", headers=headers).status_code == 200
    confirmation = revoke_token(db_engine, "ci", wait=10, direct=db_engine)
    assert confirmation is not None
    assert confirmation.listening >= 1
    assert confirmation.complete
    assert client.get("/state-machines", headers=headers).status_code == 401
    assert revoke_token(db_engine, "ci", wait=1, direct=db_engine) is None


def test_checking_a_token_costs_no_database_statement(
    client: FlaskClient, db_engine: sa.Engine, bearer: Bearer
) -> None:
    headers = bearer("read")
    assert client.get("/state-machines", headers=headers).status_code == 200
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(db_engine, "before_cursor_execute", count)
    try:
        for _ in range(20):
            assert client.get("/state-machines", headers=headers).status_code == 200
            assert (
                client.get("/state-machines", headers={"Authorization": "Bearer x"}).status_code
                == 401
            )
    finally:
        sa.event.remove(db_engine, "before_cursor_execute", count)
    assert statements == []


def test_last_use_is_written_in_one_batch_not_per_request(
    secured: flask.Flask, client: FlaskClient, db_engine: sa.Engine, bearer: Bearer
) -> None:
    used, unused = bearer("read", name="used"), bearer("read", name="unused")
    assert unused
    for _ in range(5):
        assert client.get("/state-machines", headers=used).status_code == 200
    assert {t.name: t.last_used_at for t in list_tokens(db_engine)} == {
        "used": None,
        "unused": None,
    }
    cache = token_cache(secured)
    assert cache is not None
    cache.record_uses()
    last_used = {t.name: t.last_used_at for t in list_tokens(db_engine)}
    assert last_used["used"] is not None
    assert last_used["unused"] is None


def test_secrets_never_reach_the_logs(
    client: FlaskClient, bearer: Bearer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        headers = bearer("read", "write")
        secret = headers["Authorization"].removeprefix("Bearer ")
        client.post(LABEL, json={"metadata": {"ready": True}}, headers=headers)
        client.patch(LABEL, json={"metadata": {"ready": True}}, headers=headers)  # moves: logged
        client.get("/state-machines", headers={"Authorization": headers["Authorization"] + "x"})
        client.get("/no-such-path", headers=headers)
    assert "event=transition" in caplog.text
    assert secret not in caplog.text
    assert secret[20:] not in caplog.text
