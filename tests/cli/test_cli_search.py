"""``routemaster -c CONFIG migrate`` builds the indexes the machines' ``search:`` paths need."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from routemaster.db.search_indexes import index_name
from tests.cli.test_cli import _run, empty_database

__all__ = ["empty_database"]  # the fixture, shared with the other command tests

CONFIG = """
state_machines:
  orders:
    search:
      - metadata.customer.id
    states:
      - gate: start
        exit_condition: false
"""


def test_migrate_with_the_config_builds_the_search_indexes(
    tmp_path: Path, empty_database: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    result = _run("-c", str(config), "migrate", env={"DATABASE_URL": empty_database})
    assert result.exit_code == 0, result.output
    again = _run("-c", str(config), "migrate", env={"DATABASE_URL": empty_database})
    assert again.exit_code == 0, again.output
    name = index_name("orders", ("customer", "id"))
    engine = sa.create_engine(empty_database, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            index = conn.execute(
                sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :name"), {"name": name}
            ).scalar_one()
            statistics = conn.execute(
                sa.text("SELECT count(*) FROM pg_statistic_ext WHERE stxname = :name"),
                {"name": f"{name}_values"},
            ).scalar_one()
    finally:
        engine.dispose()
    assert "(metadata #> ARRAY['customer'::text, 'id'::text])" in index
    assert "WHERE ((state_machine = 'orders'::text) AND (NOT deleted))" in index
    assert statistics == 1
