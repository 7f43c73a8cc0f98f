"""Kept label counts: folding history into them (a worker step), and counting afresh.

See :mod:`routemaster.db.label_counts`. Any number of workers fold; each
fold is one short transaction, and folds that race add every row once.
"""

from __future__ import annotations

from routemaster.app import App
from routemaster.db import label_counts
from routemaster.db.horizon import Horizon
from routemaster.service.transactions import writing

FOLD_INTERVAL = 2.0
"""Seconds between two folds of a worker: reads add at most what changed since (plus what a
transaction still open holds back)."""


def fold_label_counts(app: App) -> int:
    """Fold the history that is final into the kept counts; the rows folded."""
    with writing(app) as conn:
        if app.horizon.distributed(conn):
            below = app.horizon.confirmed(conn)
        else:
            below = Horizon.coordinator(conn)
        return label_counts.fold(conn, below)
