"""Retention's progress per table, for ``/metrics``: rows pruned, the last run, the horizon.

Written by each pruning batch (:mod:`routemaster.db.retention`) in its own
transaction; read by the metrics. Statements are written and run as
:mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.statements import fetch_all, run


@dataclass(frozen=True)
class Progress:
    table: str
    rows_pruned: int
    last_run_at: datetime.datetime | None
    horizon: datetime.datetime | None


def record_progress(
    conn: sa.Connection,
    table: str,
    *,
    rows: int,
    now: datetime.datetime,
    horizon: datetime.datetime | None,
) -> None:
    """Add ``rows`` to what pruning removed from ``table``, and when it ran, for ``/metrics``."""
    run(conn, _PROGRESS, {"table": table, "rows": rows, "now": now, "horizon": horizon})


def progress(conn: sa.Connection) -> list[Progress]:
    return [Progress(*row) for row in fetch_all(conn, _ALL_PROGRESS)]


_PROGRESS = """
    INSERT INTO retention_progress AS p (table_name, rows_pruned, last_run_at, horizon)
    VALUES (%(table)s, %(rows)s, %(now)s, %(horizon)s)
    ON CONFLICT (table_name) DO UPDATE
    SET rows_pruned = p.rows_pruned + excluded.rows_pruned, last_run_at = excluded.last_run_at,
        horizon = coalesce(excluded.horizon, p.horizon)
    """

_ALL_PROGRESS = """
    SELECT table_name, rows_pruned, last_run_at, horizon FROM retention_progress
    ORDER BY table_name
    """
