"""SIGTERM and SIGINT stop the worker, even when they come while its main thread holds a lock.

Ctrl-C in a terminal reaches ``serve``'s worker twice (from the terminal, and
passed on by ``serve``): the second signal's handler then runs inside the
first's, which held the lock of the ``Event`` that ``stop`` sets. A handler that
called ``stop`` itself waited there for its own thread, forever.
"""

from __future__ import annotations

import os
import signal
import threading

from routemaster.worker.signals import stopping_on_signals
from tests.waiting import wait_until


def test_a_signal_while_the_main_thread_holds_the_lock_stop_needs_still_stops() -> None:
    held = threading.Lock()
    calls: list[bool] = []
    before = signal.getsignal(signal.SIGTERM)

    def stop() -> None:
        got = held.acquire(timeout=10)  # called from the old handler: False after 10 s
        calls.append(got)
        if got:
            held.release()

    with stopping_on_signals(stop):
        with held:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)  # a second one, as Ctrl-C under serve sends
        # each relayed to a stop() that took the lock once this thread let it go
        wait_until(lambda: len(calls) == 2, "both signals' stop() returned", timeout=30)
    assert calls == [True, True]
    assert signal.getsignal(signal.SIGTERM) is before
