"""Indexes for the metadata paths a machine's ``search:`` names, so searches on them stay fast.

Each is a partial btree index on ``(metadata #> '{a,b}')`` over the
machine's live labels, the very expression a compiled search compares
(``routemaster/search/operands.py``), so equality and numeric range searches
on the path are index scans. The name is derived from the machine and the
path, so every worker and ``routemaster migrate`` agree on it.

They are built with ``CREATE INDEX CONCURRENTLY`` (writes go on meanwhile),
which cannot run in a transaction, so this runs in autocommit (on the direct
connection when there is one), one index at a time under a lease row
(:func:`routemaster.db.lock_rows.exclusive`). No statement timeout applies:
the engine's is set per transaction, and these statements are not one. A
build that was interrupted leaves an invalid index behind; it is dropped and
built again. Each path also gets extended statistics on the expression
(``CREATE STATISTICS``): the planner ignores a partial index's expression
statistics, and without any it guesses (a page of a rare value then walked a
million labels in name order instead of using the index); ``ANALYZE labels``
gathers them at once (:func:`routemaster.db.table_statistics.analyze`).

The machine name and the path are ordinary ``%(name)s`` parameters: the
driver writes them into the statement as quoted literals (it formats every
statement on the client; DDL takes no server-side parameters), and that is
the text the planner matches a search's condition against. An index's name
is an identifier, which no parameter can be: the DDL statements are
templates with one ``{name}`` slot, filled only with :func:`index_name`'s
``labels_search_`` and hex digits (``tests/db/test_statement_text.py``
lists these templates by name).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.lock_rows import exclusive
from routemaster.db.statements import fetch_one, fetch_value, run
from routemaster.db.table_statistics import analyze

SEARCH_INDEX_LEASE = "search indexes"
"""The lease row that serialises index builds across processes."""

_NAME = re.compile(r"labels_search_[0-9a-f]{24}(_values)?")

_VALIDITY = """
    SELECT index.indisvalid FROM pg_index AS index
    JOIN pg_class AS class ON class.oid = index.indexrelid
    WHERE class.relname = %(name)s
    """

_HAS_STATISTICS = "SELECT count(*) FROM pg_statistic_ext WHERE stxname = %(name)s"

# Templates: complete DDL but for the {name} slot (an identifier; see the module's docstring).
_CREATE_INDEX = """
    CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}
    ON labels ((metadata #> CAST(%(path)s AS text[])))
    WHERE state_machine = %(machine)s AND NOT deleted
    """

_DROP_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS {name}"

_CREATE_STATISTICS = """
    CREATE STATISTICS IF NOT EXISTS {name} ON (metadata #> CAST(%(path)s AS text[])) FROM labels
    """


def index_name(machine: str, path: Sequence[str]) -> str:
    """``labels_search_`` and a digest of the machine and the path (within 63 bytes)."""
    digest = hashlib.sha256("\x00".join((machine, *path)).encode()).hexdigest()[:24]
    return f"labels_search_{digest}"


def ensure_search_index(
    engine: sa.Engine, machine: str, path: Sequence[str], *, direct: sa.Engine | None = None
) -> bool:
    """Build the index of ``machine``'s ``metadata.<path>`` unless it exists; whether it did.

    Also the statistics of the expression, and ``ANALYZE labels`` when either is new.
    """
    name = index_name(machine, path)
    statistics = f"{name}_values"
    params = {"path": list(path), "machine": machine}
    with (
        exclusive(engine, name=SEARCH_INDEX_LEASE, wait=True),
        (direct or engine).connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
    ):
        built = False
        if not fetch_value(conn, _HAS_STATISTICS, {"name": statistics}):
            run(conn, _named(_CREATE_STATISTICS, statistics), params)
            built = True
        row = fetch_one(conn, _VALIDITY, {"name": name})
        valid = None if row is None else row[0]
        if valid is not True:
            if valid is False:  # an interrupted build: dropped and built again
                run(conn, _named(_DROP_INDEX, name))
            run(conn, _named(_CREATE_INDEX, name), params)
            built = True
        if built:
            analyze(conn, "labels", wait=True)
        return built


def _named(template: str, name: str) -> str:
    """``template`` with its ``{name}`` slot filled: only ever one of :func:`index_name`'s."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a search index name: {name!r}")
    return template.replace("{name}", name)
