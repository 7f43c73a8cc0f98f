"""Counts for the label gauges of ``/metrics``: labels, due and errored, per machine and state,
and the labels of machines that keep versions on versions other than the one in force.

The counts of ``db/counts.py``, read together in one snapshot. Callers run it
at most every few seconds, never once per scrape per process. Labels per
version are read only off the version in force: what is read is each such
machine's labels on the other versions; the labels on the version in force
(and those that keep none) are the machine's labels less those, a figure the
caller derives (:func:`routemaster.machine.upgrades.labels_by_version`, as the
machine page counts them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sqlalchemy as sa

from routemaster.db import counts
from routemaster.db.counts import StateCounts


@dataclass(frozen=True)
class LabelCounts:
    labels: StateCounts = field(default_factory=dict)
    due: StateCounts = field(default_factory=dict)
    errored: StateCounts = field(default_factory=dict)
    # per machine that keeps versions (continue and abort machines): its live labels per
    # version they keep, but for those on the version in force (every version if none is)
    beside: dict[str, dict[int, int]] = field(default_factory=dict)


def gauge_counts(engine: sa.Engine, keeping: Mapping[str, int | None]) -> LabelCounts:
    """Every count the label gauges show; ``keeping``: the machines that keep versions, each
    with its version in force (``None``: none recorded, every version read)."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        return LabelCounts(
            labels=counts.per_state(conn),
            due=counts.due_per_state(conn),
            errored=counts.errored_per_state(conn),
            beside={
                machine: counts.versions_beside(conn, machine, in_force)
                for machine, in_force in keeping.items()
            },
        )
