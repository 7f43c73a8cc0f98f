"""Fixtures for the API: an App on the test database, its Flask app and a test client.

The client checks every response it gets against the app's OpenAPI document
(:mod:`tests.api.openapi_check`), so the document cannot drift from the code.
"""

from __future__ import annotations

from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.config import load_config
from routemaster.config.model import Config
from routemaster.web import create_app
from tests.api.openapi_check import CheckedClient

CONFIG_PATH = Path(__file__).with_name("config.yaml")


@pytest.fixture(scope="session")
def config() -> Config:
    return load_config([CONFIG_PATH])


@pytest.fixture
def app(db_engine: sa.Engine, direct_engine: sa.Engine | None, config: Config) -> App:
    return App(config=config, db=db_engine, direct=direct_engine)


@pytest.fixture
def flask_app(app: App) -> flask.Flask:
    flask_app = create_app(app)
    flask_app.test_client_class = CheckedClient
    return flask_app


@pytest.fixture
def client(flask_app: flask.Flask) -> FlaskClient:
    return flask_app.test_client()
