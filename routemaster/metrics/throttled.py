"""A database reading shared by scrapes for a while, so scrapes never load the database.

The gauges read at most every ``interval`` seconds per process; when a read fails the
last reading stands (a warning is logged), so a database outage never fails ``/metrics``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import sqlalchemy as sa

T = TypeVar("T")


class ThrottledReading(Generic[T]):
    def __init__(
        self,
        read: Callable[[], T],
        *,
        what: str,
        logger: logging.Logger,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._what = what
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[float, T] | None = None

    def get(self) -> T | None:
        """The reading taken within ``interval``, else a fresh one; None: none ever taken."""
        with self._lock:
            if self._last is not None and self._clock() - self._last[0] < self._interval:
                return self._last[1]
            try:
                fresh = self._read()
            except sa.exc.SQLAlchemyError as error:
                self._logger.warning("%s not refreshed: %s", self._what, type(error).__name__)
                return self._last[1] if self._last else None
            self._last = (self._clock(), fresh)
            return fresh
