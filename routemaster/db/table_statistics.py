"""The planner's statistics kept true after many rows are written in one go.

PostgreSQL plans every statement from what ``ANALYZE`` last saw of a table
(``pg_class.reltuples``, ``pg_stats``); autovacuum gathers them again once
enough rows changed, but it may be off, or lagging behind a write of a
million rows. Then ``labels_claimable`` is believed to hold one row, and
``/metrics``, ``/receivers`` and the idle worker's next-due read walk the
wrong index until someone runs ``ANALYZE`` (docs/performance.md, "Writes of
many rows").

So whatever writes many rows at once (``migrate -c`` scheduling labels
written without a next check, the worker's backfill of the same, bulk
commands, retention) calls :func:`refresh` afterwards, with the rows it
wrote per table. A table is analysed when that write alone reached
:data:`ANALYZE_AFTER` rows, or when the server's own count of rows changed
since the table's last ``ANALYZE`` (by anyone: ``pg_stat_get_mod_since_analyze``)
is past the point at which autovacuum would analyse it: this catches a
backlog written in many small batches, and never analyses sooner than
autovacuum would. Building a search index analyses ``labels`` through
:func:`analyze` too (:mod:`routemaster.db.search_indexes`), waiting for the
lock: the index's expression statistics must be there.

After a write, ``ANALYZE (SKIP_LOCKED)``: a table another process is
analysing, vacuuming or indexing concurrently is skipped rather than waited
for (the other one keeps the statistics, or the next write's check does). It samples a fixed
number of rows (300 per unit of ``default_statistics_target``), so its cost
does not grow with the table. It runs in autocommit, on the direct connection
when there is one (Citus sends it on to every shard).
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from routemaster.db.statements import fetch_value, run

ANALYZE_AFTER = 10_000
"""Rows written in one go from which their table is analysed at once."""

_ANALYZE_LABELS = "ANALYZE (SKIP_LOCKED) labels"

_ANALYZE_HISTORY = "ANALYZE (SKIP_LOCKED) history"

# A search index's build: its expression statistics gathered, whoever holds the table.
_ANALYZE_LABELS_WAITING = "ANALYZE labels"

_ANALYZE = {"labels": _ANALYZE_LABELS, "history": _ANALYZE_HISTORY}

# Whether the rows changed since the table's last ANALYZE, as the server counts them (each
# backend's counts arrive within about a second of its commit), are past autovacuum's own
# trigger: its threshold plus its scale factor times the rows the planner believes there are.
_STALE = """
    SELECT pg_stat_get_mod_since_analyze(c.oid)
           > CAST(current_setting('autovacuum_analyze_threshold') AS float8)
             + CAST(current_setting('autovacuum_analyze_scale_factor') AS float8)
               * greatest(c.reltuples, 0)
    FROM pg_class AS c
    WHERE c.oid = to_regclass(%(table)s)
    """


def analyze(conn: sa.Connection, table: str, *, wait: bool = False) -> None:
    """``ANALYZE`` one of the tables kept here (``labels``, ``history``); with ``wait``
    (``labels`` only) even while another process holds it."""
    if wait:
        assert table == "labels", table
        run(conn, _ANALYZE_LABELS_WAITING)
    else:
        run(conn, _ANALYZE[table])


def refresh(
    engine: sa.Engine, written: Mapping[str, int], *, direct: sa.Engine | None = None
) -> list[str]:
    """After a write of ``written`` rows per table: analyse those whose statistics it left
    untrue (module docstring); the tables analysed."""
    analysed: list[str] = []
    tables = [table for table, rows in written.items() if rows > 0 and table in _ANALYZE]
    if not tables:
        return analysed
    with (direct or engine).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in tables:
            if written[table] >= ANALYZE_AFTER or fetch_value(conn, _STALE, {"table": table}):
                analyze(conn, table)
                analysed.append(table)
    return analysed
