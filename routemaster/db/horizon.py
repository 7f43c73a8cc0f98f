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
``pg_snapshot_xmin`` as on one server) is *confirmed* by the workers: a
transaction below H that committed in two phases prepared on every worker
before it committed, so after H is taken each of its prepared transactions
is either resolved (``COMMIT PREPARED`` removes a prepared transaction only
after making it visible) or listed in the worker's ``pg_prepared_xacts``.
Which transactions committed in two phases the coordinator knows itself:
Citus writes a commit record per prepared transaction into
``pg_dist_transaction`` in the committing transaction (so the record's
``xmin`` is its coordinator transaction id), and deletes it only once the
prepared transaction is gone from its worker. A round therefore reads H,
then the commit records (coordinator-local); only records it has not yet
seen resolved send it to the workers (``run_command_on_workers``), and the
horizon confirmed is H, or just below the oldest transaction still prepared
somewhere. Writes that touch one worker (one label's) leave no record, so a
stream over them never asks the workers anything. A worker that does not
answer confirms nothing, and the stream waits for it like a database outage.

One :class:`Horizon` per process (hung on the App) is shared by every
stream and the subscription sender, and rechecked at most every
:data:`REUSE` seconds; readers in between, and readers while another thread
confirms, use the last confirmed horizon: the stream waits, it never skips.

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

from routemaster.db.plumbing import database
from routemaster.db.statements import fetch_all, fetch_value

REUSE = 0.2
"""Seconds one confirmed horizon serves every reader of the process before it is checked
again (a round that took longer than a tenth of this stretches it: the rounds never take
more than a tenth of one thread's time)."""

FIRST_WAIT = 5.0
"""Seconds a process's first read waits for a first confirmed horizon before it fails (a
worker that does not answer, or a transaction left prepared until Citus recovers it)."""

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

# Citus's commit records: one per transaction prepared on a node by a transaction that
# committed here (its xmin, the 32 low bits of that transaction's id), kept until the prepared
# transaction is gone from the node.
_COMMIT_RECORDS = """
    SELECT groupid, gid, CAST(CAST(xmin AS text) AS bigint) FROM pg_dist_transaction
    """

# Every transaction prepared in this database on each worker, by node group (success false:
# a worker that did not answer), and on the coordinator itself (should it hold shards).
_PREPARED = """
    SELECT w.success, n.groupid, gid
    FROM run_command_on_workers(
        'SELECT coalesce(array_agg(gid), ''{}'') FROM pg_prepared_xacts'
        ' WHERE database = current_database()') AS w
    LEFT JOIN pg_dist_node AS n ON n.nodename = w.nodename AND n.nodeport = w.nodeport
    LEFT JOIN LATERAL unnest(CASE WHEN w.success THEN CAST(w.result AS text[]) END) AS gid
        ON true
    UNION ALL
    SELECT true, (SELECT groupid FROM pg_dist_local_group), gid FROM pg_prepared_xacts
    WHERE database = current_database()
    """


def prepared_everywhere(conn: sa.Connection) -> set[tuple[int, str]] | None:
    """Every transaction prepared in this database, by (node group, gid), on the workers and
    the coordinator (``None``: a worker did not answer)."""
    rows = fetch_all(conn, _PREPARED)
    if not all(success for success, _, _ in rows):
        return None
    return {(group, gid) for _, group, gid in rows if gid is not None}


class Unconfirmed(sa.exc.SQLAlchemyError):
    """No horizon could be confirmed yet: the stream cannot be read (like a database outage)."""


@dataclass
class Rounds:
    """What confirming has cost this process (for /metrics and docs/performance.md)."""

    rounds: int = 0  # times the coordinator's horizon was read
    record_rounds: int = 0  # times the commit records were read (the horizon had moved)
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
        self._confirmed: int | None = None
        self._checked_at = 0.0
        self._reuse = REUSE
        self._resolved: set[tuple[int, str]] = set()  # commit records seen resolved
        self.rounds = Rounds()

    @staticmethod
    def distributed(conn: sa.Connection) -> bool:
        """Whether the database is distributed (Citus): asked once per engine."""
        return database.distributed(conn)

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
        """One round: the coordinator's horizon, its commit records, the nodes if need be."""
        self.rounds.rounds += 1
        xmin = self.coordinator(conn)
        if self._confirmed is not None and xmin <= self._confirmed:
            return  # nothing finished since the last confirmed horizon
        self.rounds.record_rounds += 1
        records = {
            (group, gid): _full_xid(low, near=xmin)
            for group, gid, low in fetch_all(conn, _COMMIT_RECORDS)
        }
        self._resolved &= records.keys()
        doubtful = {
            key: xact for key, xact in records.items() if xact < xmin and key not in self._resolved
        }
        if not doubtful:
            self._advance(xmin)
            return
        started = self._clock()
        rows = fetch_all(conn, _PREPARED)
        self.rounds.worker_rounds += 1
        self.rounds.worker_seconds += self._clock() - started
        if not all(success for success, _, _ in rows):
            self.rounds.failures += 1
            return  # a node did not answer: nothing is confirmed until it does
        prepared = {(group, gid) for _, group, gid in rows if gid is not None}
        self._resolved |= doubtful.keys() - prepared
        self._advance(min([xact for key, xact in doubtful.items() if key in prepared] + [xmin]))

    def _advance(self, xmin: int) -> None:
        if self._confirmed is None or xmin > self._confirmed:
            self._confirmed = xmin


def _full_xid(low: int, *, near: int) -> int:
    """The 64-bit transaction id whose 32 low bits are ``low``, nearest to ``near``.

    A commit record's transaction committed less than 2**31 transactions
    from the coordinator's horizon (PostgreSQL's wraparound limit), either
    side of it.
    """
    full = (near & ~0xFFFFFFFF) | low
    if full > near + (1 << 31):
        return full - (1 << 32)
    if full < near - (1 << 31):
        return full + (1 << 32)
    return full
