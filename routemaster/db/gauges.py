"""Counts for the label gauges of ``/metrics``: labels, due and errored, per machine and state,
and the labels of machines that keep versions per version they follow.

The counts of ``db/counts.py``, read together in one snapshot. Callers run it
at most every few seconds, never once per scrape per process. Labels per
version are read only off the version in force: its labels are the machine's
(kept) labels less those on other versions, and labels that keep no version
follow it too (as the machine page counts them:
:func:`routemaster.machine.upgrades.labels_by_version`).
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
    # (machine, version) of the labels that keep a version (continue and abort machines)
    versions: StateCounts = field(default_factory=dict)


def gauge_counts(engine: sa.Engine, keeping: Mapping[str, int | None]) -> LabelCounts:
    """Every count the label gauges show; ``keeping``: the machines that keep versions, each
    with its version in force (``None``: none recorded, every version read)."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        labels = counts.per_state(conn)
        versions: StateCounts = {}
        for machine, in_force in keeping.items():
            others = counts.versions_beside(conn, machine, in_force)
            versions.update({(machine, str(version)): n for version, n in others.items()})
            if in_force is not None:
                total = sum(n for (name, _), n in labels.items() if name == machine)
                if rest := total - sum(others.values()):
                    versions[machine, str(in_force)] = rest
        return LabelCounts(
            labels=labels,
            due=counts.due_per_state(conn),
            errored=counts.errored_per_state(conn),
            versions=versions,
        )
