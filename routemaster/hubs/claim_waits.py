"""Claims that wait (``"wait": N``): served by one thread per API process, not by request workers.

A claim that finds nothing at once becomes a :class:`PendingClaim` held by
the process's :class:`ClaimWaiter`. Its thread listens for
``NOTIFY routemaster_due`` (sent as a label enters an action, or is
released) and polls every ``poll_interval`` for retries falling due; on
each wake-up it claims for the waiting clients, oldest first, skipping
those whose states were just found empty, and answers each client as soon
as it has tasks, or with ``{"tasks": []}`` at its deadline.

Where the answer goes: under our gunicorn workers the view leaves the
pending claim in the WSGI environ (``STREAM_KEY``, as the changes streams
do), the server takes the client's socket after the response head and
calls :meth:`PendingClaim.attach_socket`, and the request worker is free at
once; the waiter thread writes the JSON body and closes the connection
(the head has no ``Content-Length``: ``Connection: close`` ends the body).
Under any other WSGI server the response body is a generator that waits for
the answer in the server's thread.

A client that no longer wants its claim (a worker shutting down) closes its
side of the connection, or only its writing half (``shutdown(SHUT_WR)``),
so that it can still read the answer: the thread sees it at its next
wake-up (within ``poll_interval``), claims nothing for it, and answers
``{"tasks": []}``. A claim answered just before the client hung up brings
its tasks to a half-closed client, which releases them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from routemaster.app import App
from routemaster.db.notifications import Listener, due_listener
from routemaster.db.tasks import PullState, Task
from routemaster.service import tasks as task_service

logger = logging.getLogger(__name__)

SEND_TIMEOUT = 10.0  # seconds a client may take to accept a claim's answer
IDLE_EXIT = 60.0  # seconds without a waiting claim before the thread (and its LISTEN) stops


def task_json(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "state_machine": task.state_machine,
        "label": task.label,
        "state": task.state,
        "metadata": task.metadata,
        "attempt": task.attempt,
        "idempotency_token": str(task.entry_id),
        "lease_expires_at": task.lease_expires_at.isoformat(),
    }


def tasks_body(tasks: Sequence[Task], before: Mapping[str, Any] | None = None) -> bytes:
    """The claim's answer: ``{"tasks": [...]}``, after the fields of ``before`` if given."""
    body = {**(before or {}), "tasks": [task_json(task) for task in tasks]}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


class PendingClaim:
    """One waiting claim: what it wants, until when, and where its answer goes."""

    def __init__(
        self,
        states: Sequence[PullState],
        *,
        worker: str,
        limit: int,
        deadline: float,
        before: Mapping[str, Any] | None = None,
    ) -> None:
        self.states = list(states)
        self.keys = frozenset(states)
        self.before = before  # answered ahead of the tasks (the batch endpoint's completions)
        self.worker = worker
        self.limit = limit
        self.deadline = deadline  # time.monotonic()
        self.tasks: list[Task] = []
        self._answer: bytes | None = None
        self._socket: tuple[socket.socket, bytes] | None = None
        self._lock = threading.Lock()
        self._answered = threading.Event()
        self.on_undelivered: Callable[[list[Task]], None] | None = None

    def attach_socket(self, sock: socket.socket, head: bytes) -> None:
        """The server hands over the client's connection once the response head is made."""
        with self._lock:
            if self._answer is None:
                self._socket = (sock, head)
                return
        self._send(sock, head, self._answer)

    def hung_up(self) -> bool:
        """Whether the client has closed its side of the connection: it no longer wants this
        claim (a worker shutting down half-closes it), so nothing may be claimed for it. Only
        once its socket is handed over; a read that would end is the sign."""
        with self._lock:
            attached = self._socket
        if attached is None:
            return False
        sock = attached[0]
        try:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if not poller.poll(0):
                return False
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    def answer(self, tasks: list[Task]) -> None:
        """The waiter's thread: the claim is over, with these tasks (maybe none)."""
        with self._lock:
            self.tasks = tasks
            self._answer = tasks_body(tasks, self.before)
            attached, self._socket = self._socket, None
        self._answered.set()
        if attached is not None:
            self._send(*attached, self._answer)

    @property
    def answered(self) -> bool:
        return self._answered.is_set()

    def body(self) -> Iterator[bytes]:
        """The response body when no socket is handed over: waits in the server's thread."""
        self._answered.wait()
        assert self._answer is not None
        yield self._answer

    def _send(self, sock: socket.socket, head: bytes, body: bytes) -> None:
        try:
            sock.settimeout(SEND_TIMEOUT)
            sock.sendall(head + body)
        except OSError:
            logger.info("a waiting claim's client left before its answer")
            if self.tasks and self.on_undelivered is not None:
                self.on_undelivered(self.tasks)
        finally:
            with contextlib.suppress(OSError):
                sock.close()


class TooManyWaiting(Exception):
    """This process holds ``max_waiting_claims`` waiting claims already."""


class ClaimWaiter:
    """This process's waiting claims: each found nothing when made (by ``claims``) and may
    wait, so it is held until tasks come or its wait ends by the thread that serves them
    (started on first use), which claims for it through ``claims`` again.
    """

    def __init__(self, app: App, claims: task_service.PullClaims) -> None:
        self.app = app
        self.claims = claims
        self._pending: list[PendingClaim] = []
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._running = False
        self._wake_r, self._wake_w = -1, -1

    def wait_for(
        self,
        claim: task_service.NextClaim,
        wait: float,
        tasks: list[Task],
        *,
        before: Mapping[str, Any] | None = None,
    ) -> PendingClaim | None:
        """The claim held until tasks come or ``wait`` seconds pass, or ``None`` when it is
        answered now: it took tasks, may not wait, or waits on no state (the API answers
        those itself, never calling here).

        Raises :class:`TooManyWaiting` when this process holds as many as it may.
        """
        if tasks or not wait or not claim.states:
            return None
        if self.waiting >= self.app.settings.max_waiting_claims:
            raise TooManyWaiting(self.app.settings.max_waiting_claims)
        pending = PendingClaim(
            claim.states,
            worker=claim.worker,
            limit=claim.limit,
            deadline=time.monotonic() + wait,
            before=before,
        )
        self.add(pending)
        return pending

    def add(self, pending: PendingClaim) -> None:
        pending.on_undelivered = self._release
        with self._lock:
            self._start_here()
            self._pending.append(pending)
        os.write(self._wake_w, b"x")  # its deadline may be the nearest

    @property
    def running(self) -> bool:
        """Whether this process's claim thread runs (it stops after a while with nothing to do)."""
        with self._lock:
            return self._running and self._pid == os.getpid()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._pending)

    def _start_here(self) -> None:
        """Start the thread in this process if it is not running (after a fork, the
        parent's thread is not here; after a while with no waiting claim, it stops)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._pending = []
            self._running = False
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
        if not self._running:
            self._running = True
            thread = threading.Thread(target=self._run, name="routemaster-claims", daemon=True)
            thread.start()

    def _run(self) -> None:
        metrics = self.app.metrics
        listener = due_listener(
            self.app.direct or self.app.db,
            self.app.db,
            on_change=None if metrics is None else metrics.listening("claims"),
            what="waiting claims' wake-ups",
        )
        try:
            self._serve(listener)
        finally:
            listener.close()

    def _serve(self, listener: Listener) -> None:
        """Claim for the waiting clients on every wake-up: a NOTIFY, a new client, a poll."""
        poll = self.app.settings.poll_interval
        idle_since = time.monotonic()
        while True:
            with self._lock:
                pending = list(self._pending)
                if pending:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > IDLE_EXIT:
                    self._running = False  # under the lock: the next add starts a new thread
                    return
            try:
                for claim in pending:
                    if claim.hung_up():
                        self._finish(claim, [])
                pending = [claim for claim in pending if claim.answered is False]
                if pending:
                    self._claim_for(pending)
            except Exception:
                logger.exception("claiming for waiting clients failed")
                self.app.hooks.exception("claiming for waiting clients failed")
            self._answer_expired(time.monotonic())
            with self._lock:
                deadlines = [claim.deadline for claim in self._pending]
            timeout = min([poll, *(deadline - time.monotonic() for deadline in deadlines)])
            if self._wake_r in listener.wait(max(timeout, 0.001), [self._wake_r]).fds:
                _drain(self._wake_r)

    def _claim_for(self, pending: list[PendingClaim]) -> None:
        empty: set[tuple[str, str]] = set()
        for claim in pending:
            if claim.hung_up():  # answered now, with nothing claimed for it
                self._finish(claim, [])
                continue
            if claim.keys <= empty:
                continue
            tasks = self.claims.claim(
                task_service.NextClaim(claim.states, claim.worker, claim.limit)
            )
            if len(tasks) < claim.limit:
                empty |= claim.keys
            if tasks:
                self._finish(claim, tasks)

    def _answer_expired(self, now: float) -> None:
        with self._lock:
            expired = [claim for claim in self._pending if claim.deadline <= now]
        for claim in expired:
            self._finish(claim, [])

    def _finish(self, claim: PendingClaim, tasks: list[Task]) -> None:
        with self._lock:
            self._pending.remove(claim)
        claim.answer(tasks)

    def _release(self, tasks: list[Task]) -> None:
        for task in tasks:
            with contextlib.suppress(task_service.LeaseLost, task_service.TaskNotFound):
                task_service.release(self.app, task.id)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
