"""Clock-trigger occurrences: each interval or daily occurrence is handled once.

The primary key (trigger key, occurrence) settles which of many workers
handles an occurrence: the first to insert it.
"""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster.db.statements import run


def record_occurrence(conn: sa.Connection, trigger_key: str, occurrence: datetime.datetime) -> bool:
    """Whether this call is the first, across all workers, to handle the occurrence."""
    return run(conn, _RECORD_OCCURRENCE, {"key": trigger_key, "occurrence": occurrence}) == 1


def forget_occurrences(conn: sa.Connection, before: datetime.datetime) -> None:
    """Old occurrences can never be computed again, so their rows only take space."""
    run(conn, _FORGET_OCCURRENCES, {"before": before})


_RECORD_OCCURRENCE = """
    INSERT INTO trigger_occurrences (trigger_key, occurrence) VALUES (%(key)s, %(occurrence)s)
    ON CONFLICT DO NOTHING
    """

_FORGET_OCCURRENCES = "DELETE FROM trigger_occurrences WHERE occurrence < %(before)s"
