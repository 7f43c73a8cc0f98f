"""Indexes for the metadata paths a machine's ``search:`` names, so searches on them stay fast.

Each is a partial btree index on ``(metadata #> '{a,b}')`` over the
machine's live labels, the very expression a compiled search compares
(``routemaster/search/operands.py``), so equality and numeric range searches
on the path are index scans. The name is derived from the machine and the
path, so every worker and ``routemaster migrate`` agree on it.

They are built with ``CREATE INDEX CONCURRENTLY`` (writes go on meanwhile),
which cannot run in a transaction, so this runs in autocommit, one index at
a time under an advisory lock, and followed by ``ANALYZE labels`` so the
planner has the statistics of the new expression at once (autovacuum would
gather them only later). A build that was interrupted leaves an
invalid index behind; it is dropped and built again. DDL takes no bound
parameters: the machine name and the path are written as SQL string
literals with their quotes doubled (and the configuration allows only
letters, digits, ``_`` and ``-`` in a search path).
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


def index_name(machine: str, path: Sequence[str]) -> str:
    """``labels_search_`` and a digest of the machine and the path (within 63 bytes)."""
    digest = hashlib.sha256("\x00".join((machine, *path)).encode()).hexdigest()[:24]
    return f"labels_search_{digest}"


def ensure_search_index(engine: sa.Engine, machine: str, path: Sequence[str]) -> bool:
    """Build the index of ``machine``'s ``metadata.<path>`` unless it exists; whether it did."""
    name = index_name(machine, path)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:lock)"), {"lock": _LOCK})
        conn.exec_driver_sql("SET statement_timeout = 0")  # a build may take minutes
        try:
            valid = conn.execute(_VALIDITY, {"name": name}).scalar_one_or_none()
            if valid is True:
                return False
            if valid is False:
                conn.exec_driver_sql(_DROP.format(name=name))
            statement = _CREATE.format(name=name, path=_text_array(path), machine=_literal(machine))
            conn.exec_driver_sql(statement)
            # The planner knows the expression's values only once ANALYZE has read them:
            # without it, a page of a rare value may walk the whole machine in name order.
            conn.exec_driver_sql("ANALYZE labels")
            return True
        finally:
            conn.exec_driver_sql("RESET statement_timeout")
            conn.execute(sa.text("SELECT pg_advisory_unlock(:lock)"), {"lock": _LOCK})


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _text_array(path: Sequence[str]) -> str:
    return "CAST(ARRAY[" + ", ".join(_literal(segment) for segment in path) + "] AS text[])"
