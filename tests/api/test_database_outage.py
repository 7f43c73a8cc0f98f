"""``GET /`` answers 503 while the database is unreachable and 200 once it is back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from routemaster import __version__
from routemaster.app import App
from routemaster.config.model import Config
from routemaster.db.database import create_engine
from routemaster.web import create_app
from tests.api.helpers import body
from tests.api.tcp_proxy import TcpProxy


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    url = sa.engine.make_url(database_url)
    forwarder = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    forwarder.start()
    yield forwarder
    forwarder.stop()


def test_root_is_503_during_an_outage_and_200_after_without_restart(
    proxy: TcpProxy, database_url: str, config: Config, db_engine: sa.Engine
) -> None:
    url = sa.engine.make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    engine = create_engine(url.render_as_string(hide_password=False))
    client = create_app(App(config=config, db=engine)).test_client()
    try:
        assert client.get("/").status_code == 200
        assert (
            client.post("/state-machines/user/labels/a", json={"metadata": {}}).status_code == 201
        )

        proxy.stop()
        down = client.get("/")
        assert down.status_code == 503
        assert body(down) == {
            "status": "error",
            "message": "Cannot connect to database",
            "version": __version__,
        }
        label = client.get("/state-machines/user/labels/a")
        assert label.status_code == 503
        assert body(label) == {"message": "Cannot connect to database"}

        proxy.start()
        assert client.get("/").status_code == 200
        assert client.get("/state-machines/user/labels/a").status_code == 200
    finally:
        engine.dispose()
