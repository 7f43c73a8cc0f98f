"""Kept label counts: folding history into them (a worker step), and counting afresh.

See :mod:`routemaster.db.label_counts`. Any number of workers fold; each
fold is one short transaction, and folds that race add every row once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from routemaster.app import App
from routemaster.db import label_counts
from routemaster.db.horizon import Horizon
from routemaster.service.transactions import writing

FOLD_INTERVAL = 2.0
"""Seconds between two folds of a worker: reads add at most what changed since (plus what a
transaction still open holds back)."""

IDLE_FOLD_INTERVAL = 32.0
"""On Citus, the longest a worker waits between folds that find nothing (see :class:`FoldPace`)."""


def fold_label_counts(app: App) -> int:
    """Fold the history that is final into the kept counts; the rows folded."""
    return _fold(app)[0]


def _fold(app: App) -> tuple[int, bool]:
    """The rows folded, and whether the database is distributed (Citus)."""
    with writing(app) as conn:
        distributed = app.horizon.distributed(conn)
        below = app.horizon.confirmed(conn) if distributed else Horizon.coordinator(conn)
        return label_counts.fold(conn, below), distributed


class FoldPace:
    """A worker's folds: every :data:`FOLD_INTERVAL`; on Citus, where a fold reads the
    horizon and every shard of ``history``, a fold that finds nothing doubles the wait
    before the next (up to :data:`IDLE_FOLD_INTERVAL`) and one that folds rows resets it.
    Counts stay exact either way: a read adds the history not folded yet."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next = 0.0
        self._wait = FOLD_INTERVAL

    def fold(self, app: App) -> int:
        """A fold if its time has come (the rows folded; 0 if not run)."""
        now = self._clock()
        if now < self._next:
            return 0
        folded, distributed = _fold(app)
        if folded or not distributed:
            self._wait = FOLD_INTERVAL
        else:
            self._wait = min(2 * self._wait, IDLE_FOLD_INTERVAL)
        self._next = now + self._wait - FOLD_INTERVAL / 2  # the step runs every FOLD_INTERVAL
        return folded
