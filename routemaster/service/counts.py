"""The counts of labels per state (listings by name: :func:`routemaster.service.search.listing`)."""

from __future__ import annotations

from routemaster.app import App
from routemaster.db import counts
from routemaster.db.counts import StateCount

__all__ = ["StateCount", "state_counts"]


def state_counts(app: App, machine: str) -> dict[str, StateCount]:
    """How many live labels, and how many of them errored, are in each state."""
    with app.db.connect() as conn:
        return counts.in_machine(conn, machine)
