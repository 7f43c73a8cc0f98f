"""The API as gunicorn loads it in tests: built from environment variables.

The engine is used before gunicorn forks (``--preload``), so the parent holds
a pooled connection that the workers must not share.
"""

from __future__ import annotations

import os

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.database import create_engine
from routemaster.web import create_app

engine = create_engine(os.environ["ROUTEMASTER_TEST_DATABASE_URL"])
with engine.connect() as connection:
    connection.execute(sa.text("SELECT 1"))

application = create_app(
    App(config=load_config([os.environ["ROUTEMASTER_TEST_CONFIG"]]), db=engine)
)
