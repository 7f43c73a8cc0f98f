"""The worker's log of the database's availability: one line per change, a reminder each minute."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger("routemaster.worker.loop")  # where operators have always seen it

OUTAGE_REMINDER_SECONDS = 60


class OutageLog:
    """One log line per change of the database's availability, and a reminder each minute."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._down_since: float | None = None
        self._reminded_at = 0.0

    def down(self, error: Exception) -> None:
        now = self._clock()
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if self._down_since is None:
            self._down_since = self._reminded_at = now
            logger.error("database unavailable; the worker waits for it: %s", reason)
        elif now - self._reminded_at >= OUTAGE_REMINDER_SECONDS:
            self._reminded_at = now
            logger.error(
                "database still unavailable after %d s: %s", now - self._down_since, reason
            )

    def up(self) -> None:
        if self._down_since is not None:
            logger.info("database available again after %d s", self._clock() - self._down_since)
            self._down_since = None
