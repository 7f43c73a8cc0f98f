"""Label listings by name and the counts per state, without a search expression."""

from __future__ import annotations

from routemaster.app import App
from routemaster.db.listings import StateCount, label_counts, label_page

__all__ = ["StateCount", "page_of_labels", "state_counts"]


def page_of_labels(
    app: App,
    machine: str,
    *,
    after: str,
    limit: int,
    state: str | None,
    errored: bool,
    prefix: str,
) -> list[tuple[str, str]]:
    """A page of the machine's labels by name, ``(name, state)``, with the listing's filters."""
    return label_page(
        app.db, machine, after=after, limit=limit, state=state, errored=errored, prefix=prefix
    )


def state_counts(app: App, machine: str) -> dict[str, StateCount]:
    """How many live labels, and how many of them errored, are in each state."""
    return label_counts(app.db, machine)
