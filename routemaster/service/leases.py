"""Pull actions' leases, set at each claim (SPEC E4, dfsmr's timeout strategies).

A fixed lease (``worker: {lease: 5m}``) is what it says. A percentile lease
(``worker: {lease: {percentile: 95, min: 30s, max: 10m}}``) is the P-th
percentile, by nearest rank, of the claim-to-completion durations of the
action's last 100 completed tasks, clamped to [min, max], and ``min`` while
fewer than 20 have completed: leases follow how long the work really takes.

Choosing is pure (:func:`choose`). Reading the durations costs one indexed
statement of at most 100 rows per action (``db/task_records.py``);
:class:`LeaseBook` keeps each action's durations for a few seconds of the
app's clock, so a busy claim path reads them once per interval per process
rather than once per claim.
"""

from __future__ import annotations

import datetime
import math
import threading
from collections.abc import Sequence
from fractions import Fraction

import sqlalchemy as sa

from routemaster.config.model import Action, Config, PercentileLease, PullWorker
from routemaster.db import task_records
from routemaster.db.tasks import Lease, LeasedState, PullState

MIN_SAMPLES = 20  # completions before a percentile lease is trusted; ``min`` until then
KEEP_FOR = datetime.timedelta(seconds=5)  # how long a process reuses an action's durations


def nearest_rank(durations: Sequence[float], percentile: float) -> float:
    """The P-th percentile by nearest rank: the smallest value with at least P% at or below.

    The rank is ``ceil(P / 100 * N)``, computed exactly (a float product would put
    ``7 / 100 * 100`` one rank too high).
    """
    ordered = sorted(durations)
    rank = math.ceil(Fraction(str(percentile)) * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]


def choose(worker: PullWorker, durations: Sequence[float] | None) -> Lease:
    """The lease a claim sets now, given the action's latest completion durations."""
    lease = worker.lease
    if not isinstance(lease, PercentileLease):
        return Lease(lease.total_seconds(), "fixed", 0)
    samples = len(durations or ())
    low, high = lease.min.total_seconds(), lease.max.total_seconds()
    if not durations or samples < MIN_SAMPLES:
        return Lease(low, "min", samples)
    value = nearest_rank(durations, lease.percentile)
    if value < low:
        return Lease(low, "min", samples)
    if value > high:
        return Lease(high, "max", samples)
    return Lease(value, "percentile", samples)


def pull_worker(config: Config, state_machine: str, state: str) -> PullWorker:
    action = config.get_machine(state_machine).get_state(state)
    assert isinstance(action, Action) and action.worker is not None, "a pull action"
    return action.worker


class LeaseBook:
    """One process's recent completion durations per percentile action, kept ``KEEP_FOR``."""

    def __init__(self) -> None:
        self._kept: dict[PullState, tuple[datetime.datetime, list[float]]] = {}
        self._lock = threading.Lock()

    def leases(
        self,
        conn: sa.Connection,
        config: Config,
        states: Sequence[PullState],
        *,
        now: datetime.datetime,
    ) -> list[LeasedState]:
        """Each state with the lease a claim there sets now (stale durations read on ``conn``)."""
        workers = {key: pull_worker(config, *key) for key in states}
        wanted = [
            key for key, worker in workers.items() if isinstance(worker.lease, PercentileLease)
        ]
        with self._lock:
            durations = {
                key: kept[1]
                for key in wanted
                if (kept := self._kept.get(key)) is not None and abs(now - kept[0]) < KEEP_FOR
            }
        stale = [key for key in wanted if key not in durations]
        if stale:
            fresh = task_records.recent_durations(conn, stale)
            durations |= fresh
            with self._lock:
                self._kept.update({key: (now, seconds) for key, seconds in fresh.items()})
        return [
            (machine, state, choose(workers[machine, state], durations.get((machine, state))))
            for machine, state in states
        ]
