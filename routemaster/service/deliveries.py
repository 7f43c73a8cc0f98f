"""The delivery log read: a label's outbound calls, every call filtered, the latest failures."""

from __future__ import annotations

from routemaster.app import App
from routemaster.db import deliveries as log
from routemaster.db.deliveries import Delivery, DeliveryFilter

__all__ = ["Delivery", "DeliveryFilter", "matching", "of_label", "recent_failures"]


def of_label(
    app: App, machine: str, label: str, *, limit: int, before: int | None = None
) -> list[Delivery]:
    """The label's calls, newest first, below the position ``before`` (none: from the newest)."""
    with app.db.connect() as conn:
        return log.of_label(conn, machine, label, limit=limit, before=before)


def matching(app: App, where: DeliveryFilter, *, limit: int, before: int | None) -> list[Delivery]:
    """Every call ``where`` keeps, newest first, below the position ``before``."""
    with app.db.connect() as conn:
        return log.matching(conn, where, limit=limit, before=before)


def recent_failures(app: App, *, limit: int) -> list[Delivery]:
    """The latest failed calls, newest first."""
    with app.db.connect() as conn:
        return log.recent_failures(conn, limit=limit)
