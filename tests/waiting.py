"""Waiting in tests: for a condition with a deadline, for a process to answer, for threads to meet.

Tests wait for an event (a state reached, a request received, a line
logged), never for a fixed time: :func:`wait_until` polls a condition until
it holds and fails the test, saying what was awaited, once the deadline
passes. :func:`run_together` releases several threads at the same moment
for the tests that race requests.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

Message = str | Callable[[], object]
"""What was awaited; a callable is asked only on failure (to show a log, a state)."""


def wait_until(
    condition: Callable[[], T | None],
    what: Message = "",
    *,
    timeout: float = 10.0,
    every: float = 0.02,
) -> T:
    """``condition()``'s first true value; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"not within {timeout} s: {detail}")
        time.sleep(every)
    return value


def wait_answering(
    url: str, process: subprocess.Popen[bytes] | subprocess.Popen[str], *, timeout: float = 30.0
) -> None:
    """Until ``url`` answers HTTP (any status); fails if ``process`` ends first or time runs out."""

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the process ended ({process.returncode}) before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answered, with an error status
        except OSError:
            return False

    wait_until(answers, f"{url} answering", timeout=timeout, every=0.05)


def run_together(count: int, work: Callable[[int], T]) -> list[T]:
    """``work(i)`` for ``i`` in ``range(count)``, in ``count`` threads released at one moment."""
    barrier = threading.Barrier(count)

    def start(index: int) -> T:
        barrier.wait()
        return work(index)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(start, range(count)))
