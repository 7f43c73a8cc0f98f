"""How far the changes stream may read on Citus: the coordinator's horizon, workers confirming.

On one PostgreSQL the stream's horizon is the oldest transaction still
running (:mod:`routemaster.db.changes`): every history row of a transaction
below it is visible to the statement that reads it. On Citus that is not
enough. History rows live on the workers, and a transaction that writes to
two of them commits in two phases: it prepares on every worker, commits on
the coordinator (from then on its coordinator transaction id is below the
coordinator's horizon), and only then sends ``COMMIT PREPARED`` to the
workers one by one. Between the two, the coordinator says "finished" while
one worker's rows are still invisible; a reader that trusted the horizon
would pass them for good. (A transaction that writes to one worker commits
there *before* the coordinator commits, so it never shows that gap.)

So a horizon H taken on the coordinator (the same refined
``pg_snapshot_xmin`` as on one server) is only *confirmed* once every
transaction prepared on the workers at a moment after H was taken has
resolved: a transaction below H prepared on every worker before it
committed on the coordinator, so it is either visible already or in that
list, and once the listed ones are gone (``COMMIT PREPARED`` removes a
prepared transaction only after making it visible), every row below H is
visible. Until a horizon is confirmed, readers use the last confirmed one;
the stream waits, it never skips. A worker that does not answer confirms
nothing, and the stream waits for it like a database outage.

Listing the workers' prepared transactions costs a connection to every
worker (``run_command_on_workers`` opens new ones), so it is done by one
:class:`Horizon` per process (hung on the App), shared by every stream and
the subscription sender, at most once per :data:`REUSE` seconds, and not at
all while the coordinator's horizon has not moved past the confirmed one (an
idle stream asks nothing of the workers). Each confirmation round confirms
the newest earlier candidate whose listed transactions have all gone, and
takes a new candidate; under steady two-phase writes the confirmed horizon
trails the coordinator's by about one round.

On plain PostgreSQL (or with history not distributed) none of this runs:
:meth:`Horizon.distributed` says so once per process, and the stream keeps
its one statement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.statements import fetch_all, fetch_value

REUSE = 0.2
"""Seconds one confirmed horizon serves every reader of the process before it is checked
again (a round that took longer than a tenth of this stretches it: the rounds never take
more than a tenth of one thread's time)."""

FIRST_WAIT = 5.0
"""Seconds a process's first read waits for a first confirmed horizon before it fails (a
worker that does not answer, or a transaction left prepared until Citus recovers it)."""

CANDIDATES = 16
"""Unconfirmed horizons kept while a prepared transaction stays unresolved; when full, the
newest is replaced, so the oldest still confirm as soon as their transactions resolve."""

# Whether Citus is installed here at all (its catalog table is named only once it is).
_CITUS = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"

_HISTORY_DISTRIBUTED = """
    SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                   WHERE logicalrelid = to_regclass('history'))
    """

# The coordinator's horizon, as the changes stream computes it on one server (db/changes.py
# reads it in the same statement as the history it applies to): the oldest
# transaction running when the statement's snapshot was taken, leaving out those running in
# another database (which cannot have written our history).
_COORDINATOR_HORIZON = """
    WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s)
    SELECT CAST(LEAST(
        pg_snapshot_xmax(snap.s),
        (SELECT min(running) FROM pg_snapshot_xip(snap.s) AS running
         WHERE NOT EXISTS (
             SELECT 1 FROM pg_stat_activity AS other
             WHERE other.backend_xid = xid(running)
               AND other.datname IS DISTINCT FROM current_database()))) AS text)
    FROM snap
    """

# Every transaction prepared in this database, on each worker (one row per worker that
# failed, with success false) and on the coordinator itself (should it hold shards).
_PREPARED = """
    SELECT w.success, w.nodename || ':' || w.nodeport, gid
    FROM run_command_on_workers(
        'SELECT coalesce(array_agg(gid), ''{}'') FROM pg_prepared_xacts'
        ' WHERE database = current_database()') AS w
    LEFT JOIN LATERAL unnest(CASE WHEN w.success THEN CAST(w.result AS text[]) END) AS gid
        ON true
    UNION ALL
    SELECT true, 'coordinator', gid FROM pg_prepared_xacts
    WHERE database = current_database()
    """


class Unconfirmed(sa.exc.SQLAlchemyError):
    """No horizon could be confirmed yet: the stream cannot be read (like a database outage)."""


@dataclass(frozen=True)
class _Candidate:
    """A coordinator horizon, and the transactions prepared on the nodes just after it."""

    xmin: int
    prepared: frozenset[str]  # "node gid"


@dataclass
class Rounds:
    """What confirming has cost this process (for /metrics and docs/performance.md)."""

    rounds: int = 0  # times the coordinator's horizon was read
    worker_rounds: int = 0  # times the workers' prepared transactions were listed
    worker_seconds: float = 0.0  # time spent listing them
    failures: int = 0  # listings a node did not answer


class Horizon:
    """The process's changes-stream horizon on Citus: read by every stream and the sender.

    Thread-safe: one thread confirms while the others go on with the last
    confirmed horizon.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._distributed: bool | None = None
        self._confirmed: int | None = None
        self._checked_at = 0.0
        self._reuse = REUSE
        self._candidates: list[_Candidate] = []
        self.rounds = Rounds()

    def distributed(self, conn: sa.Connection) -> bool:
        """Whether history is distributed (Citus): read once per process."""
        if self._distributed is None:
            self._distributed = bool(fetch_value(conn, _CITUS)) and bool(
                fetch_value(conn, _HISTORY_DISTRIBUTED)
            )
        return self._distributed

    def confirmed(self, conn: sa.Connection) -> int:
        """A coordinator transaction id below which every history row is visible on its worker.

        At most :data:`REUSE` seconds old; ``conn`` is used when it is time to
        check again. The first call of a process waits for a first confirmed
        horizon (:class:`Unconfirmed` after :data:`FIRST_WAIT` seconds).
        """
        known = self._confirmed
        if known is not None:
            if self._clock() - self._checked_at < self._reuse:
                return known
            if not self._lock.acquire(blocking=False):
                return known  # another thread is confirming
        else:
            self._lock.acquire()
        try:
            if self._confirmed is None or self._clock() - self._checked_at >= self._reuse:
                self._check(conn)
            deadline = self._clock() + FIRST_WAIT
            pause = 0.005
            while self._confirmed is None:
                if self._clock() >= deadline:
                    raise Unconfirmed("the Citus workers' prepared transactions did not resolve")
                time.sleep(pause)
                pause = min(2 * pause, 0.2)
                self._check(conn)
            return self._confirmed
        finally:
            self._lock.release()

    @staticmethod
    def coordinator(conn: sa.Connection) -> int:
        """The coordinator's horizon, unconfirmed (on one server: the stream's horizon)."""
        return int(fetch_value(conn, _COORDINATOR_HORIZON))

    def forget_after_fork(self) -> None:
        """A forked child starts with a free lock (the confirmed horizon stays true)."""
        self._lock = threading.Lock()

    def _check(self, conn: sa.Connection) -> None:
        started = self._clock()
        self._confirm(conn)
        self._checked_at = self._clock()
        self._reuse = max(REUSE, 10 * (self._checked_at - started))

    def _confirm(self, conn: sa.Connection) -> None:
        """One round: the coordinator's horizon, then (if it moved) the nodes' prepared list."""
        self.rounds.rounds += 1
        xmin = self.coordinator(conn)
        if self._confirmed is not None and xmin <= self._confirmed:
            return  # nothing finished since the last confirmed horizon
        started = self._clock()
        rows = fetch_all(conn, _PREPARED)
        self.rounds.worker_rounds += 1
        self.rounds.worker_seconds += self._clock() - started
        if not all(success for success, _, _ in rows):
            self.rounds.failures += 1
            return  # a node did not answer: nothing is confirmed until it does
        prepared = frozenset(f"{node} {gid}" for _, node, gid in rows if gid is not None)
        for index in range(len(self._candidates) - 1, -1, -1):
            if self._candidates[index].prepared.isdisjoint(prepared):
                self._advance(self._candidates[index].xmin)
                del self._candidates[: index + 1]
                break
        if not prepared:
            self._advance(xmin)
            self._candidates.clear()
        elif len(self._candidates) < CANDIDATES:
            self._candidates.append(_Candidate(xmin, prepared))
        else:
            self._candidates[-1] = _Candidate(xmin, prepared)

    def _advance(self, xmin: int) -> None:
        if self._confirmed is None or xmin > self._confirmed:
            self._confirmed = xmin
