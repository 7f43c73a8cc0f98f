"""``routemaster serve``'s process tree: the API and one worker, started, watched, stopped together.

``serve`` (without ``--no-worker``) runs no gunicorn itself: it starts two
child processes, each a fresh interpreter running the same code as a
command of its own (``serve --no-worker`` and ``cron``), so nothing (a
database pool above all) is ever shared across a fork. This process then
only waits:

- SIGTERM, SIGINT and SIGQUIT are passed to both children, which stop
  gracefully (gunicorn finishes its requests, the worker its deliveries);
  ``serve`` exits once both have, 0 when both exited cleanly. SIGINT is
  passed on as SIGTERM, which means the same to a running worker: a child
  still starting (Ctrl-C as the API begins to answer, with the worker still
  loading) has Python's own handlers, and SIGINT's KeyboardInterrupt ended
  it with exit 1 ("Aborted!"), as if it had failed; SIGTERM ends it cleanly.
  Gunicorn then stops gracefully, where its SIGINT would be its quick stop:
  the second Ctrl-C is the quick one (below).
- A second stopping signal (Ctrl-C again) stops at once: each child's whole
  process group (gunicorn's workers too) is killed, and ``serve`` exits 1
  once they are reaped. Deliveries then in flight are sent again once their
  leases run out.
- Each child runs in a process group of its own, so that only ``serve``
  signals it: Ctrl-C in a terminal (or ``kill`` of the group) reaches
  ``serve`` once, which passes it on once, instead of each child getting it
  twice (from the terminal and from ``serve``), and the second Ctrl-C kills
  a child's descendants with it.
- SIGHUP, SIGTTIN, SIGTTOU and SIGUSR1 are gunicorn's (reload, one worker
  more or fewer, reopen logs): they go to the API only.
- A child that ends while nobody asked it to is a failure: the other is
  stopped and ``serve`` exits 1, so that whatever runs ``serve`` (a Procfile
  platform, Kubernetes, systemd, compose's restart policy) starts it again,
  rather than an API running on with labels no longer moving.
- On Linux each child is also told to stop should this process be killed
  outright (``PR_SET_PDEATHSIG``): no worker outlives its ``serve``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

logger = logging.getLogger(__name__)

STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
PASSED_ON_AS: dict[int, int] = {
    signal.SIGINT: signal.SIGTERM
}  # a stopping signal as the children get it
API_ONLY_SIGNALS = (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1)
PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    """One process of the tree: its name in log lines, its command, and what it receives."""

    name: str
    command: Sequence[str]
    takes_api_signals: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    status: int | None = None  # its exit code once reaped (negative: killed by that signal)


def supervise(children: Sequence[Child], env: Mapping[str, str] | None = None) -> int:
    """Run ``children`` until a stopping signal or until one ends; the exit code for ``serve``."""
    tree = _Tree(children)
    preexec = _die_with(os.getpid())
    previous = {
        sig: signal.signal(sig, tree.on_signal) for sig in (*STOPPING_SIGNALS, *API_ONLY_SIGNALS)
    }
    try:
        for child in children:
            child.process = subprocess.Popen(
                child.command,
                env=None if env is None else dict(env),
                preexec_fn=preexec,
                process_group=0,  # signalled by serve alone (module docstring)
            )
            logger.info("serve: started the %s (pid %d)", child.name, child.process.pid)
            if tree.killing:  # two signals came while starting: this one too, at once
                tree.kill(child)
            elif tree.stopping:  # a signal came while starting: pass it on to this one too
                tree.signal(child, PASSED_ON_AS.get(tree.stopping, tree.stopping))
        return tree.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Tree:
    def __init__(self, children: Sequence[Child]) -> None:
        self.children = children
        self.stopping: int | None = None  # the stopping signal received, if any
        self.failed = False
        self.killing = False  # a second stopping signal came: children killed, not waited for

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum in STOPPING_SIGNALS:
            if self.stopping is None:
                logger.info("serve: received signal %d, stopping the API and the worker", signum)
                self.stopping = signum
                for child in self.children:
                    self.signal(child, PASSED_ON_AS.get(signum, signum))
            else:  # asked again while stopping: at once
                logger.warning(
                    "serve: received signal %d again, killing the API and the worker", signum
                )
                self.failed = self.killing = True
                for child in self.children:
                    self.kill(child)
        else:
            for child in self.children:
                if child.takes_api_signals:
                    self.signal(child, signum)

    @staticmethod
    def signal(child: Child, signum: int) -> None:
        # os.kill, not Popen.send_signal (which may reap the child behind wait()'s back);
        # only wait() reaps, so a pid not yet reaped is still this child's.
        if child.process is not None and child.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signum)

    @staticmethod
    def kill(child: Child) -> None:
        """SIGKILL to the child's process group: gunicorn's workers end with their master."""
        if child.process is not None and child.status is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)

    def wait(self) -> int:
        """Reap children until all have ended; stop the rest when one ends unasked."""
        while any(child.status is None for child in self.children):
            try:
                pid, status = os.wait()
            except ChildProcessError:  # none left to reap (should not happen): read what is known
                for unreaped in self.children:
                    if unreaped.status is None and unreaped.process is not None:
                        unreaped.status = unreaped.process.poll()
                break
            ended = [c for c in self.children if c.process is not None and c.process.pid == pid]
            if not ended:
                continue  # an orphan reparented to us (when we are PID 1): reaped, nothing more
            [child] = ended
            assert child.process is not None
            child.status = child.process.returncode = os.waitstatus_to_exitcode(status)
            if self.stopping is None:
                logger.error(
                    "serve: the %s (pid %d) ended unexpectedly (%s); stopping the rest",
                    child.name,
                    pid,
                    _describe(child.status),
                )
                self.failed = True
                self.stopping = signal.SIGTERM
                for other in self.children:
                    self.signal(other, signal.SIGTERM)
            else:
                logger.info("serve: the %s stopped (%s)", child.name, _describe(child.status))
        if self.failed:
            return 1
        return 0 if all(_stopped_cleanly(child.status) for child in self.children) else 1


def _stopped_cleanly(status: int | None) -> bool:
    """Exit 0, or ended by the stopping signal passed on (before it could set a handler)."""
    return status == 0 or (status is not None and -status in STOPPING_SIGNALS)


def _describe(status: int | None) -> str:
    if status is not None and status < 0:
        return f"signal {-status}"
    return f"exit code {status}"


def _die_with(parent: int) -> Callable[[], None] | None:
    """What a child runs before exec: SIGTERM when ``parent`` dies, however (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def arrange() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # serve died before the call above: do not run unwatched
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange
