"""Indexes for the metadata paths a machine's ``search:`` names, so searches on them stay fast.

Each is a partial btree index on ``(metadata #> '{a,b}')`` over the
machine's live labels, the very expression a compiled search compares
(``routemaster/search/operands.py``), so equality and numeric range searches
on the path are index scans. The name is derived from the machine and the
path, so every worker and ``routemaster migrate`` agree on it.

They are built with ``CREATE INDEX CONCURRENTLY`` (writes go on meanwhile),
which cannot run in a transaction, so this runs in autocommit, one index at
a time under an advisory lock. A build that was interrupted leaves an
invalid index behind; it is dropped and built again. Each path also gets
extended statistics on the expression (``CREATE STATISTICS``): the planner
ignores a partial index's expression statistics, and without any it guesses
(a page of a rare value then walked a million labels in name order instead
of using the index); ``ANALYZE labels`` gathers them at once.

DDL takes no bound parameters: the machine name and the path are written as
SQL string literals with their quotes doubled (and the configuration allows
only letters, digits, ``_`` and ``-`` in a search path).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa

_LOCK = 2024_11_24  # serialises index builds across processes

_VALIDITY = sa.text(
    """
    SELECT index.indisvalid FROM pg_index AS index
    JOIN pg_class AS class ON class.oid = index.indexrelid
    WHERE class.relname = :name
    """
)

_CREATE = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON labels ((metadata #> {path}))"
    " WHERE state_machine = {machine} AND NOT deleted"
)

_DROP = "DROP INDEX CONCURRENTLY IF EXISTS {name}"

_HAS_STATISTICS = sa.text("SELECT count(*) FROM pg_statistic_ext WHERE stxname = :name")

_CREATE_STATISTICS = "CREATE STATISTICS IF NOT EXISTS {name} ON (metadata #> {path}) FROM labels"


def index_name(machine: str, path: Sequence[str]) -> str:
    """``labels_search_`` and a digest of the machine and the path (within 63 bytes)."""
    digest = hashlib.sha256("\x00".join((machine, *path)).encode()).hexdigest()[:24]
    return f"labels_search_{digest}"


def ensure_search_index(engine: sa.Engine, machine: str, path: Sequence[str]) -> bool:
    """Build the index of ``machine``'s ``metadata.<path>`` unless it exists; whether it did.

    Also the statistics of the expression, and ``ANALYZE labels`` when either is new.
    """
    name = index_name(machine, path)
    statistics = f"{name}_values"
    array = _text_array(path)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:lock)"), {"lock": _LOCK})
        conn.exec_driver_sql("SET statement_timeout = 0")  # a build may take minutes
        try:
            built = False
            if not conn.execute(_HAS_STATISTICS, {"name": statistics}).scalar_one():
                conn.exec_driver_sql(_CREATE_STATISTICS.format(name=statistics, path=array))
                built = True
            valid = conn.execute(_VALIDITY, {"name": name}).scalar_one_or_none()
            if valid is not True:
                if valid is False:
                    conn.exec_driver_sql(_DROP.format(name=name))
                machine_literal = _literal(machine)
                conn.exec_driver_sql(_CREATE.format(name=name, path=array, machine=machine_literal))
                built = True
            if built:
                conn.exec_driver_sql("ANALYZE labels")
            return built
        finally:
            conn.exec_driver_sql("RESET statement_timeout")
            conn.execute(sa.text("SELECT pg_advisory_unlock(:lock)"), {"lock": _LOCK})


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _text_array(path: Sequence[str]) -> str:
    return "CAST(ARRAY[" + ", ".join(_literal(segment) for segment in path) + "] AS text[])"
