"""Counts for the label gauges of ``/metrics``: labels, due and errored, per machine and state,
and labels per machine version (those that keep one).

The grouped counts of ``db/counts.py``, read together in one connection.
Callers run it at most every few seconds, never once per scrape per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from routemaster.db import counts
from routemaster.db.counts import StateCounts


@dataclass(frozen=True)
class LabelCounts:
    labels: StateCounts = field(default_factory=dict)
    due: StateCounts = field(default_factory=dict)
    errored: StateCounts = field(default_factory=dict)
    # (machine, version) of the labels that keep a version (continue and abort machines)
    versions: StateCounts = field(default_factory=dict)


def gauge_counts(engine: sa.Engine) -> LabelCounts:
    """Every count the label gauges show."""
    with engine.connect() as conn:
        return LabelCounts(
            labels=counts.per_state(conn),
            due=counts.due_per_state(conn),
            errored=counts.errored_per_state(conn),
            versions={
                (machine, str(version)): n
                for machine, per_version in counts.per_version(conn).items()
                for version, n in per_version.items()
            },
        )
