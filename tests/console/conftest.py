"""The console's tests use the API's fixtures: an App on the test database, a client."""

from tests.api.conftest import app, client, config, flask_app

__all__ = ["app", "client", "config", "flask_app"]
