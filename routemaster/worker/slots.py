"""The worker's delivery slots: a thread pool that knows what it holds and wakes the loop.

Every job is a :class:`~routemaster.service.in_flight.Claim` (a delivery or a gate
evaluation that reads feeds). The loop sleeps in ``select`` on :attr:`wake_fd`
(beside its ``LISTEN`` connection), so a finished job wakes it at once and
nothing polls while work is in flight.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from routemaster.service.in_flight import Claim

logger = logging.getLogger(__name__)

Job = Callable[[Claim], bool]
"""Runs one claim; ``True`` when it ends in something for the loop to record (a delivery)."""


class Slots:
    def __init__(self, size: int, on_error: Callable[[str], None] | None = None) -> None:
        """``on_error`` is told (while it is handled) of a job that raised."""
        self.size = size
        self._on_error = on_error
        self._pool = ThreadPoolExecutor(size, thread_name_prefix="routemaster-delivery")
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str, int], Claim] = {}
        self._done: list[Claim] = []
        self.wake_fd, self._wake_write = os.pipe()
        # Held while the pipe's write end is used or closed. Reentrant: a signal handler's
        # wake() may interrupt shutdown() on the same thread.
        self._pipe_lock = threading.RLock()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_write, False)

    @property
    def free(self) -> int:
        with self._lock:
            return self.size - len(self._held)

    def held(self) -> list[Claim]:
        """The claims in flight (or queued for a slot): their leases must be kept."""
        with self._lock:
            return list(self._held.values())

    def submit(self, claim: Claim, job: Job) -> None:
        with self._lock:
            self._held[claim.entry] = claim

        def run() -> None:
            done = False
            try:
                done = job(claim)
            except Exception:
                message = f"worker job for {claim.state_machine}/{claim.name} failed"
                logger.exception(message)
                if self._on_error is not None:
                    self._on_error(message)
            finally:
                with self._lock:
                    self._held.pop(claim.entry, None)
                    if done:
                        self._done.append(claim)
                self.wake()

        self._pool.submit(run)

    def take_done(self) -> list[Claim]:
        """The jobs that ended in something to record, since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def wake(self) -> None:
        """Wake the loop (from any thread, or a signal handler); nothing once shut down."""
        with self._pipe_lock:  # shutdown() closes it between our test and our write otherwise
            if self._wake_write < 0:
                return
            with contextlib.suppress(BlockingIOError):  # a full pipe: the loop is awake already
                os.write(self._wake_write, b"\0")

    def clear_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_fd, 4096):
                pass

    def shutdown(self) -> None:
        """Wait for every job in flight, then release the pipe."""
        self._pool.shutdown(wait=True)
        with self._pipe_lock:
            write, self._wake_write = self._wake_write, -1  # a late stop() must not write to it
            os.close(write)
        os.close(self.wake_fd)
