"""The migrations and the table definitions the code reads (db/schema.py) agree."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from routemaster.db.schema import metadata


def test_migrated_database_matches_the_table_definitions(db_engine: sa.Engine) -> None:
    with db_engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)
    assert differences == []
