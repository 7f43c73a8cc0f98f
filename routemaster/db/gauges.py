"""Counts for the label gauges of ``/metrics``: labels, due and errored, per machine and state,
and labels per machine version (those that keep one).

Four grouped counts in one read-only transaction, each served by a partial
index (``labels_by_state``, ``labels_errored``, ``labels_due``,
``labels_by_version``). Callers run
it at most every few seconds, never once per scrape per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from routemaster.db.statements import fetch_all

_LABELS = "SELECT state_machine, state, count(*) FROM labels WHERE NOT deleted GROUP BY 1, 2"

_ERRORED = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE errored AND NOT deleted GROUP BY 1, 2
    """

_DUE = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE due_at <= now() AND NOT deleted GROUP BY 1, 2
    """

_VERSIONS = """
    SELECT state_machine, CAST(version AS text), count(*) FROM labels
    WHERE version IS NOT NULL AND NOT deleted GROUP BY 1, 2
    """

StateCounts = dict[tuple[str, str], int]


@dataclass(frozen=True)
class LabelCounts:
    labels: StateCounts = field(default_factory=dict)
    due: StateCounts = field(default_factory=dict)
    errored: StateCounts = field(default_factory=dict)
    # (machine, version) of the labels that keep a version (continue and abort machines)
    versions: StateCounts = field(default_factory=dict)


def label_counts_by_state(engine: sa.Engine) -> LabelCounts:
    with engine.connect() as conn:

        def counts(query: str) -> StateCounts:
            return {(machine, state): n for machine, state, n in fetch_all(conn, query)}

        return LabelCounts(
            labels=counts(_LABELS),
            due=counts(_DUE),
            errored=counts(_ERRORED),
            versions=counts(_VERSIONS),
        )
