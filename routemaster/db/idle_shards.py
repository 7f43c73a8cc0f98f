"""On Citus, what a listening worker knows while nothing is due, so idle rounds send no statement.

A claim's read across the shards (:meth:`~routemaster.db.shards.ShardMap.shards_with_work`)
runs one statement on every shard. A ``cron`` with nothing to do runs its claims' reads every
round (about once a second) and reads the next due time across the shards before each sleep:
on two workers that was a third of a core spent finding nothing. So on Citus, while the
worker's ``LISTEN`` is known to work (:mod:`routemaster.db.notifications`), a read that found
nothing makes its claim **quiet**: the claim runs no statement again until one of

- a ``NOTIFY routemaster_due`` (work became due now, or a bulk command started);
- the earliest due time known (:meth:`IdleShards.next_due`: one read across the shards for the
  labels due after the quiet reads ran, the due times of labels and the ends of pauses; and
  ``routemaster_due_later`` notifications, which writers on Citus send for a later due time
  they set) has come;
- a round of this worker that found work (its own writes set due times too);
- :data:`QUIET_SECONDS` have passed (a safety net: due times written by processes that do not
  notify, a run-out lease of a pull task claimed since, another worker's own writes).

On one server, and whenever the worker is polling (its ``LISTEN`` unchecked or lost), nothing
is ever quiet: every round reads as before. One per engine, in its
:class:`~routemaster.db.shards.ShardMap`.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterable

from routemaster.db.statements import Statement

QUIET_SECONDS = 30.0
"""The longest a claim's read stays quiet without a wake-up (and a next due time is kept)."""


class IdleShards:
    """Which claims' reads across the shards are quiet, and the next due time known."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._listening = False
        # find -> (until: clock time, since: the ``now`` of the read that found nothing, None
        # for a read of work without a due time: bulk items, labels without a next check)
        self._quiet: dict[Statement, tuple[float, datetime.datetime | None]] = {}
        # The next due time after ``_covers`` (read, lowered by notifications), kept a while.
        self._next_due: datetime.datetime | None = None
        self._covers: datetime.datetime | None = None
        self._kept_until = 0.0

    def hearing(self, listening: bool) -> None:
        """Whether the worker hears ``NOTIFY`` now; while it does not, nothing is quiet."""
        with self._lock:
            self._listening = listening
            if not listening:
                self._forget()

    def wake(self) -> None:
        """Something may be due now: every claim reads across the shards again."""
        with self._lock:
            self._forget()

    def heard(self, payloads: Iterable[str]) -> None:
        """Notifications on the due channels: an empty payload (or one not a time) wakes every
        claim; a time (``routemaster_due_later``) lowers the next due time known."""
        with self._lock:
            for payload in payloads:
                try:
                    at = datetime.datetime.fromisoformat(payload)
                except ValueError:
                    self._forget()
                    return
                if at.tzinfo is None or self._covers is None:
                    continue  # nothing is quiet without a read of the next due time
                if self._next_due is None or at < self._next_due:
                    self._next_due = at

    def quiet(self, find: Statement, now: object) -> bool:
        """Whether ``find`` may be skipped: it found nothing since the last wake-up, and the
        next due time known (read after it found nothing) has not come by ``now``."""
        with self._lock:
            kept = self._quiet.get(find)
            if kept is None or not self._listening:
                return False
            until, since = kept
            if self._clock() >= until:
                return False
            if since is None:
                return True  # no due time: woken by a notification or a busy round alone
            if self._covers is None or self._covers > since:
                return False
            if not isinstance(now, datetime.datetime):
                return False
            if self._next_due is not None and now >= self._next_due:
                self._forget()
                return False
            return self._clock() < self._kept_until

    def found(self, find: Statement, now: object, *, rows: int) -> None:
        """``find`` read across the shards at ``now`` (none: work without a due time) and found
        ``rows`` rows."""
        with self._lock:
            if rows or not self._listening:
                self._quiet.pop(find, None)
                return
            since = now if isinstance(now, datetime.datetime) else None
            self._quiet[find] = (self._clock() + QUIET_SECONDS, since)

    def kept_next_due(self) -> tuple[bool, datetime.datetime | None]:
        """The next due time kept, when it covers every quiet read (``True``) without a read."""
        with self._lock:
            timed = [kept[1] for kept in self._quiet.values() if kept[1] is not None]
            if not self._listening or not timed:
                return False, None
            since = min(timed)
            covered = self._covers is not None and self._covers <= since
            if covered and self._clock() < self._kept_until:
                return True, self._next_due
            return False, None

    def next_due(
        self, read: Callable[[datetime.datetime], datetime.datetime | None]
    ) -> tuple[bool, datetime.datetime | None]:
        """The next due time after the earliest quiet read's ``now``, from ``read(since)`` (one
        read across the shards) only when what is kept does not cover the quiet reads; and
        whether anything is quiet (``False``: the caller reads as on one server)."""
        kept = self.kept_next_due()
        if kept[0]:
            return kept
        with self._lock:
            timed = [kept[1] for kept in self._quiet.values() if kept[1] is not None]
            if not self._listening or not timed:
                return False, None
            since = min(timed)
        at = read(since)
        with self._lock:
            self._next_due, self._covers = at, since
            self._kept_until = self._clock() + QUIET_SECONDS
            return True, at

    def _forget(self) -> None:
        self._quiet.clear()
        self._next_due = self._covers = None
        self._kept_until = 0.0
