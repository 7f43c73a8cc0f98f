"""A request worker told to stop quickly twice, the second time inside the first, stops."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The second signal is sent from inside the thread pool's shutdown lock, the moment the
# terminal's SIGINT and the master's SIGQUIT met when they came close together under serve.
SECOND_SIGNAL_INSIDE_THE_FIRST = textwrap.dedent(
    """
    import logging, os, signal
    from gunicorn.config import Config
    from routemaster.server.workers import JsonErrorsKeepAlive

    worker = JsonErrorsKeepAlive(0, os.getppid(), [], None, 30, Config(), logging.getLogger())
    worker.tpool = worker.get_thread_pool()
    worker.PIPE = os.pipe()
    for fd in worker.PIPE:
        os.set_blocking(fd, False)
    worker.init_signals()
    lock = worker.tpool._shutdown_lock

    class SecondSignalInside:
        sent = False

        def __enter__(self):
            lock.acquire()
            if not SecondSignalInside.sent:
                SecondSignalInside.sent = True
                os.kill(os.getpid(), signal.SIGQUIT)
            return self

        def __exit__(self, *exc):
            lock.release()

    worker.tpool._shutdown_lock = SecondSignalInside()
    os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(3)  # not reached: the quick stop exits 0
    """
)


def test_a_second_quick_stop_inside_the_first_does_not_hang_the_worker() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SECOND_SIGNAL_INSIDE_THE_FIRST],
        capture_output=True,
        text=True,
        timeout=60,  # before the fix it never ended (the master's SIGKILL, 30 s on, ended it)
    )
    assert done.returncode == 0, done.stderr
