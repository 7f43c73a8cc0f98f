"""SIGTERM and SIGINT stop the worker gracefully: the process edge, kept apart from the loop.

Python runs a signal handler in the main thread, between any two of its
bytecodes: possibly while that thread holds a lock (an ``Event``'s, a slot
pipe's, logging's), or inside the handler itself when a second signal comes
(one stop can reach a worker twice: systemd signals every process of the
service and ``serve`` passes it on too; a ``cron`` in a terminal gets each
Ctrl-C). A handler that took such a lock would wait for the very
thread it interrupted, forever. So the handler takes none: it writes the
signal's number to a pipe, and a thread of this module reads it and calls
``stop`` (which may take whatever locks it needs, as any thread may).

Once a signal asked the worker to stop, leaving does not bring back the
previous handlers: the process is on its way out, and such a second signal
may come only now (the worker's loop can finish within a millisecond of the
first). Python's own handler would raise
``KeyboardInterrupt`` in whatever cleanup runs then: ``exit 1`` ("Aborted!")
or death by SIGINT for a clean stop, or cleanup cut half-way. Later SIGTERMs
and SIGINTs are ignored instead; ``serve`` stops a worker that lingers itself
(a second Ctrl-C kills it, see :mod:`routemaster.server.supervisor`).
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
    """Call ``stop`` on SIGTERM or SIGINT while inside; the previous handlers come back after,
    unless a signal came: then both stay ignored (the process is ending)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the handler never waits

    received: list[int] = []  # appended to by the handler: no lock taken

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
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
        for sig, handler in previous.items():  # asked to stop: ignored until the process ends
            signal.signal(sig, signal.SIG_IGN if received else handler)
        os.close(write_end)
        relaying.join()
        os.close(read_end)
