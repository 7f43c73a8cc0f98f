"""After a write of many rows: the planner's statistics gathered again where it left them untrue.

The rule and its statements are :mod:`routemaster.db.table_statistics`; every
writer of many label rows (``migrate -c``'s scheduling and the worker's
backfill, :mod:`~routemaster.service.scheduling`; bulk batches,
:mod:`~routemaster.service.bulk`; retention,
:mod:`~routemaster.service.retention`) calls :func:`after_writing` once its
write has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from routemaster.app import App
from routemaster.db import table_statistics
from routemaster.service.transactions import one_statement, reading

logger = logging.getLogger(__name__)


def after_writing(app: App, written: Mapping[str, int]) -> list[str]:
    """Given the rows just written per table, ``ANALYZE`` those whose statistics the write left
    untrue, each in a statement of its own (no transaction around it); the tables analysed."""
    tables = [t for t, rows in written.items() if rows > 0 and t in table_statistics.TABLES]
    if not tables:
        return []
    with reading(app) as conn:
        stale = [table for table in tables if table_statistics.stale(conn, table, written[table])]
    for table in stale:
        with one_statement(app) as conn:
            table_statistics.analyze(conn, table)
    if stale:
        logger.info("gathered the planner's statistics of %s again", ", ".join(stale))
    return stale
