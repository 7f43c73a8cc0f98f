"""A machine's ``search:`` paths get an index, and searches on those paths use it."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from routemaster.db.search import Search, count_statement, page_statement
from routemaster.db.search_indexes import ensure_search_index, index_name
from routemaster.db.statements import fetch_all
from routemaster.search import compile_search

MACHINE = "it's"  # a quote in the name: DDL writes it as a literal
PATH = ("customer", "id")


@pytest.fixture
def indexed(db_engine: sa.Engine) -> Iterator[sa.Engine]:
    with db_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at,"
                " entry_id, name_key, shard_key) SELECT :sm, 'n' || i,"
                " jsonb_build_object('customer', jsonb_build_object('id', i % 500), 'total', i),"
                " 's', now(), 1, routemaster_label_key('n' || i), routemaster_shard_key('n' || i)"
                " FROM generate_series(1, 5000) AS i"
            ),
            {"sm": MACHINE},
        )
        conn.execute(sa.text("ANALYZE labels"))
    assert ensure_search_index(db_engine, MACHINE, PATH) is True
    yield db_engine
    with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {index_name(MACHINE, PATH)}")
        conn.exec_driver_sql(f"DROP STATISTICS IF EXISTS {index_name(MACHINE, PATH)}_values")


def _plan(engine: sa.Engine, where: str, *, count: bool = False) -> str:
    """The plan of the very statement a page (or a count) of ``where`` runs."""
    compiled = compile_search(where, datetime.datetime.now(datetime.UTC))
    search = Search(MACHINE, compiled.sql, compiled.params)
    sql, params = count_statement(search) if count else page_statement(search, after="", limit=50)
    with engine.connect() as conn:
        return "\n".join(row[0] for row in fetch_all(conn, f"EXPLAIN {sql}", params))


def test_the_index_is_built_once_and_named_from_machine_and_path(indexed: sa.Engine) -> None:
    assert ensure_search_index(indexed, MACHINE, PATH) is False
    assert index_name(MACHINE, PATH) == index_name(MACHINE, PATH)
    assert index_name(MACHINE, PATH) != index_name("other", PATH)
    assert len(index_name(MACHINE, PATH)) <= 63


def test_equality_and_range_searches_on_the_path_use_it(indexed: sa.Engine) -> None:
    name = index_name(MACHINE, PATH)
    assert name in _plan(indexed, "metadata.customer.id = 42")
    assert name in _plan(indexed, "metadata.customer.id > 490", count=True)
    assert name in _plan(indexed, "metadata.customer.id = 42 and metadata.total > 10")
    assert name not in _plan(indexed, "metadata.total = 42")
