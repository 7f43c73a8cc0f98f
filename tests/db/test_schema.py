"""The migrations and the table definitions the code reads (db/schema.py) agree."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.dialects.postgresql import base as postgresql_base

from routemaster.db.plumbing.database import distributed
from routemaster.db.plumbing.migrate import distribute
from routemaster.db.schema import Xid8, metadata


def test_migrated_database_matches_the_table_definitions(
    db_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reflection does not know xid8 (history.xact_id) unless told.
    monkeypatch.setitem(postgresql_base.ischema_names, "xid8", Xid8)
    with db_engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)
    assert differences == []


def test_plain_postgresql_is_not_distributed_and_migrate_leaves_it_so(
    db_engine: sa.Engine,
) -> None:
    assert distribute(db_engine) == []
    assert distributed(db_engine) is False
