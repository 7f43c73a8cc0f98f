"""SIGTERM and SIGINT stop the worker gracefully: the process edge, kept apart from the loop.

Python runs a signal handler in the main thread, between any two of its
bytecodes: possibly while that thread holds a lock (an ``Event``'s, a slot
pipe's, logging's), or inside the handler itself when a second signal comes
(Ctrl-C in a terminal reaches ``serve``'s worker twice: from the terminal and
from ``serve``). A handler that took such a lock would wait for the very
thread it interrupted, forever. So the handler takes none: it writes the
signal's number to a pipe, and a thread of this module reads it and calls
``stop`` (which may take whatever locks it needs, as any thread may).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger(__name__)


@contextmanager
def stopping_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Call ``stop`` on SIGTERM or SIGINT while inside; the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the handler never waits

    def handle(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # a full pipe: stopping is asked for already
            os.write(write_end, bytes([signum]))

    def relay() -> None:
        while received := os.read(read_end, 1):  # b"": the write end closed on leaving
            logger.info("received signal %d", received[0])
            stop()

    relaying = threading.Thread(target=relay, name="stop-on-signal", daemon=True)
    relaying.start()
    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_end)
        relaying.join()
        os.close(read_end)
