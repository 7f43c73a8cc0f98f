"""SIGTERM and SIGINT stop the worker gracefully: the process edge, kept apart from the loop."""

from __future__ import annotations

import logging
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

    def handle(signum: int, frame: FrameType | None) -> None:
        logger.info("received signal %d", signum)
        stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
