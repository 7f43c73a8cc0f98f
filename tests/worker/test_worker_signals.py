"""SIGTERM and SIGINT stop the worker, even when they come while its main thread holds a lock,
and once they did, later ones are ignored until the process ends.

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
    try:
        assert calls == [True, True]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # on its way out (below)
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_second_sigint_after_the_stop_is_ignored_not_a_keyboard_interrupt() -> None:
    """The worker's loop may end within a millisecond of the first SIGINT, before serve's
    copy of it comes: Python's handler, back by then, raised KeyboardInterrupt in the
    worker's cleanup ("Aborted!", exit 1, for a clean stop)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stopped = threading.Event()
    try:
        with stopping_on_signals(stopped.set):
            os.kill(os.getpid(), signal.SIGINT)
            assert stopped.wait(30)
        os.kill(os.getpid(), signal.SIGINT)  # the second of the Ctrl-C: nothing raised
        os.kill(os.getpid(), signal.SIGTERM)  # nor does a SIGTERM end the process
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_without_a_signal_the_previous_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with stopping_on_signals(lambda: None):
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before
