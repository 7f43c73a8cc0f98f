"""The pull worker: claims for its free slots, runs the handler, finishes tasks, drains on a signal.

Threads: the caller of :meth:`Worker.run` waits for a signal and drains;
a *claimer* claims as many tasks as there are free slots with a waiting
claim (``wait``), sending the completions queued by then in the same
request (``POST /tasks/complete`` with ``claim``); a *sender* sends the
outcomes that came in while the claimer waited, completions in batches of
up to 100 and failures one by one; a *heartbeat* thread keeps every lease
(:mod:`routemaster.client.heartbeats`); ``concurrency`` handler threads run
the tasks, each on one of them.

Drain (SIGTERM, SIGINT or :meth:`Worker.stop`): no more claims; running
handlers get ``grace`` seconds; a claim waiting on the service is cancelled
(its connection half-closed, :class:`~routemaster.client.service.ClaimConnection`)
and what it brings released; the tasks whose handlers still run after the
grace are released (their results will be dropped); the outcomes queued are sent. A second signal
stops at once, leaving the leases to run out.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from routemaster.client.book import Book, Held
from routemaster.client.heartbeats import keep_leases
from routemaster.client.service import Answer, ClaimConnection, Refused, Service
from routemaster.client.task import Completion, Fail, Failure, Outcome, Task

logger = logging.getLogger(__name__)

Handler = Callable[[Task], dict[str, Any] | None]

BATCH = 100  # the service's most per claim and per batch completion
SEND_MARGIN = 5.0  # seconds after its lease ran out (by our clock) that an outcome is still sent
GATHER = 0.005  # seconds a claim waits for more slots to free up, at most
SENDER_AFTER = 0.05  # seconds a claim is in flight before the sender sends what it could carry
TURN = 0.5  # seconds between looks of the waiting threads at their stop signals


class Worker:
    """A worker for one pull action (or every pull action of a machine, or of the service).

    ``token`` is read from ``ROUTEMASTER_TOKEN`` when not given; ``name`` (shown in the
    service's explanations) defaults to ``HOST-PID``; ``wait`` is how long a claim waits on
    the service for work.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        state_machine: str | None = None,
        state: str | None = None,
        concurrency: int = 8,
        grace: float = 30.0,
        wait: float = 20.0,
        name: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= wait <= 60:
            raise ValueError("wait must be from 0 to 60 seconds")
        self.url = url
        self.token = token if token is not None else os.environ.get("ROUTEMASTER_TOKEN") or None
        self.state_machine = state_machine
        self.state = state
        self.grace = grace
        self.wait = wait
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self._handler: Handler | None = None
        self._book = Book(concurrency)
        self._draining = threading.Event()
        self._stopping = threading.Event()  # stop at once: no backoff, no drain
        self._finished = threading.Event()  # the drain is over: the helper threads end
        self._refused: Refused | None = None
        self._claiming_since: float | None = None  # when the claimer's request began
        self._claims: ClaimConnection | None = None  # the claimer's, to cancel on a drain
        self._tasks: queue.SimpleQueue[Held | None] = queue.SimpleQueue()  # to the handlers

    def task(self, handler: Handler) -> Handler:
        """Decorator: ``handler(task)`` does the work; its dict is merged into the metadata."""
        self._handler = handler
        return handler

    def stop(self) -> None:
        """As a signal: the first call drains, a second stops at once."""
        if self._draining.is_set():
            self._stopping.set()
        self._draining.set()
        with self._book.changed:
            self._book.changed.notify_all()

    def run(self) -> bool:
        """Work until SIGTERM or SIGINT (or :meth:`stop`), then drain. True after a clean
        drain; False when stopped at once. Raises :class:`Refused` when the service refuses
        the claims (no such pull action, a token without the ``work`` scope)."""
        if self._handler is None:
            raise RuntimeError("no handler: decorate one with @worker.task")
        restore = self._catch_signals()
        for n in range(self._book.concurrency):
            self._thread(self._run_handlers, f"handler-{n}")
        helpers = [
            self._thread(self._supervised(self._claim, "claimer"), "claimer"),
            self._thread(self._supervised(self._send, "sender"), "sender"),
            self._thread(self._supervised(self._keep_leases, "heartbeat"), "heartbeats"),
        ]
        logger.info(
            "worker %s: claiming from %s (%s) with %d slots",
            self.name,
            self.url,
            "/".join(filter(None, [self.state_machine, self.state])) or "every pull action",
            self._book.concurrency,
        )
        try:
            while not self._draining.wait(TURN):
                pass
            clean = self._drain(helpers[0])
        finally:
            self._finished.set()
            for _ in range(self._book.concurrency):
                self._tasks.put(None)  # the handler threads end once their task is done
            restore()
        if self._refused is not None:
            raise self._refused
        return clean

    def _drain(self, claimer: threading.Thread) -> bool:
        book = self._book
        with book.lock:
            running = book.busy
            claims = self._claims
        if claims is not None:
            claims.cancel()  # a claim waiting on the service is answered now
        logger.info("draining: %d running, up to %.0f s for them to finish", running, self.grace)
        deadline = time.monotonic() + self.grace
        while not book.wait_for(lambda: book.busy == 0, min(TURN, self.grace)):
            if self._stopping.is_set():
                return False
            if time.monotonic() >= deadline:
                break
        while claimer.is_alive():  # a claim in flight: what it brings is released
            claimer.join(TURN)
            if self._stopping.is_set():
                return False
        service = self._service()
        try:
            for held in book.running():
                logger.warning(
                    "%s/%s still running after %g s: released (its result will be dropped)",
                    held.task.state_machine,
                    held.task.label,
                    self.grace,
                )
                self._finish_lease(service, held.task, service.release)
        finally:
            service.close()
        while not book.wait_for(lambda: not book.held, TURN):
            if self._stopping.is_set():
                return False
        logger.info("drained: nothing held")
        return True

    def _claim(self) -> None:
        """Claim for the free slots, sending the completions queued by then along."""
        book = self._book
        service = self._service()
        with book.lock:
            self._claims = service.claims
        if self._draining.is_set():
            service.claims.cancel()
        try:
            while not self._draining.is_set():
                if not book.wait_for(lambda: book.free > 0 or self._draining.is_set(), TURN):
                    continue
                if self._draining.is_set():
                    break
                # Slots free up one by one: a moment's wait lets a claim (and the completions
                # it carries) cover the handlers finishing together, not one at a time.
                book.wait_for(lambda: book.busy == 0 or self._draining.is_set(), GATHER)
                with book.lock:
                    limit = min(book.free, BATCH)
                    self._claiming_since = time.monotonic()
                try:
                    claimed = self._claim_some(service, limit)
                finally:
                    with book.lock:
                        self._claiming_since = None
                if claimed is None:
                    continue
                tasks = [Task.from_json(body) for body in claimed]
                if self._draining.is_set():
                    for task in tasks:
                        self._finish_lease(service, task, service.release, held=False)
                    break
                for task in tasks:
                    self._start(book.take(task))
        except Refused as error:
            logger.error("the service refused the claim: %s", error)
            self._refused = error
            self.stop()
        finally:
            service.close()

    def _claim_some(self, service: Service, limit: int) -> list[dict[str, Any]] | None:
        claim: dict[str, Any] = {"worker": self.name, "limit": limit, "wait": self.wait}
        if self.state_machine is not None:
            claim["state_machine"] = self.state_machine
        if self.state is not None:
            claim["state"] = self.state

        def keep_trying() -> bool:
            return not self._draining.is_set()

        completions = self._book.take_outcomes(BATCH, Completion)
        if not completions:
            return service.claim(claim, keep_trying)
        try:
            answer = service.complete([_body(c) for c in completions], claim, keep_trying)
        except Refused:
            self._book.give_back(completions)  # a refused claim completes nothing
            raise
        if answer is None:
            self._book.give_back(completions)
            return None
        self._completed(answer[0], completions)
        return answer[1]

    def _start(self, held: Held) -> None:
        self._tasks.put(held)

    def _run_handlers(self) -> None:
        """One of ``concurrency`` handler threads: tasks from the claimer until ``None``."""
        while (held := self._tasks.get()) is not None:
            self._handle(held)

    def _handle(self, held: Held) -> None:
        """Run the handler on one task; queue its outcome unless its lease is gone."""
        task = held.task
        assert self._handler is not None
        outcome: Outcome
        try:
            result = self._handler(task)
        except Fail as failed:
            outcome = Failure(task, failed.message, failed.retry, failed.retry_after)
        except Exception as error:
            logger.exception("handler raised on %s/%s", task.state_machine, task.label)
            outcome = Failure(task, f"{type(error).__name__}: {error}", retry=True)
        else:
            if result is None or isinstance(result, dict):
                outcome = Completion(task, result or {})
            else:
                why = f"the handler returned a {type(result).__name__}, not a dict"
                logger.error("%s/%s: %s", task.state_machine, task.label, why)
                outcome = Failure(task, why, retry=True)
        if not self._book.finish(held, outcome):
            reason = "its lease was lost" if task.lease_lost else "it was released at shutdown"
            logger.warning(
                "%s/%s: the handler's result is dropped: %s", task.state_machine, task.label, reason
            )

    def _send(self) -> None:
        """Send the outcomes queued while the claimer waits: completions in batches."""
        book = self._book
        service = self._service()
        try:
            while not self._finished.is_set():
                if not book.wait_for(
                    lambda: bool(book.outcomes) and self._for_sender(), SENDER_AFTER
                ):
                    continue
                completions = book.take_outcomes(BATCH, Completion)
                if completions:
                    self._send_completions(service, completions)
                for failure in book.take_outcomes(BATCH, Failure):
                    self._send_failure(service, failure)
        finally:
            service.close()

    def _for_sender(self) -> bool:
        """Whether queued outcomes are the sender's to send (under the book's lock): failures
        always; completions not when the claimer is about to take them along in a claim, only
        when it has been in its request a while (waiting on the service for work), or has no
        slot to claim for, or no longer claims."""
        since = self._claiming_since
        if self._draining.is_set() or any(isinstance(o, Failure) for o in self._book.outcomes):
            return True
        if since is None:
            return self._book.free == 0
        return time.monotonic() - since >= SENDER_AFTER

    def _send_completions(self, service: Service, completions: list[Completion]) -> None:
        answer = service.complete(
            [_body(c) for c in completions], None, self._until_leases_end(completions)
        )
        if answer is None:
            self._given_up([c.task for c in completions], "completed")
        else:
            self._completed(answer[0], completions)

    def _send_failure(self, service: Service, failure: Failure) -> None:
        task = failure.task
        answer = service.fail(
            task.id,
            failure.error,
            retry=failure.retry,
            retry_after=failure.retry_after,
            keep_trying=self._until_leases_end([failure]),
        )
        if answer is None:
            self._given_up([task], "failed")
        elif answer.ok:
            self._book.end(task.id)
            logger.info("%s/%s failed: %s", task.state_machine, task.label, failure.error)
        else:
            self._lost(task, answer, "failure")

    def _completed(self, answers: list[Answer], completions: list[Completion]) -> None:
        tasks = {c.task.id: c.task for c in completions}
        for answer in answers:
            task = tasks[answer.task_id]
            if answer.ok:
                self._book.end(task.id)
                logger.debug("%s/%s completed", task.state_machine, task.label)
            else:
                self._lost(task, answer, "result")

    def _lost(self, task: Task, answer: Answer, what: str) -> None:
        self._book.lose(task.id)
        logger.warning(
            "%s/%s: the %s is dropped, the service refused it (%s): %s",
            task.state_machine,
            task.label,
            what,
            answer.body.get("reason", answer.body.get("status", "404")),
            answer.message,
        )

    def _given_up(self, tasks: list[Task], what: str) -> None:
        for task in tasks:
            self._book.lose(task.id)
            logger.error(
                "%s/%s could not be %s before its lease ran out (the service was unreachable):"
                " the service will offer it again",
                task.state_machine,
                task.label,
                what,
            )

    def _until_leases_end(self, outcomes: list[Completion] | list[Failure]) -> Callable[[], bool]:
        """Keep trying while one of these tasks' leases may still be running."""
        with self._book.lock:
            held = [self._book.held.get(o.task.id) for o in outcomes]
            last = max((h.deadline for h in held if h is not None), default=0.0)
        return lambda: time.monotonic() < last + SEND_MARGIN

    def _finish_lease(
        self,
        service: Service,
        task: Task,
        call: Callable[[str, Callable[[], bool]], Answer | None],
        *,
        held: bool = True,
    ) -> None:
        """Release (``call``) a task, retried while its lease may run; no longer held after."""
        with self._book.lock:
            record = self._book.held.get(task.id)
            last = record.deadline if record is not None else time.monotonic() + 30
        answer = call(task.id, lambda: time.monotonic() < last + SEND_MARGIN)
        if answer is not None and not answer.ok:
            logger.info("%s/%s: not ours: %s", task.state_machine, task.label, answer.message)
        if held:
            self._book.end(task.id)

    def _keep_leases(self) -> None:
        service = self._service()
        try:
            keep_leases(self._book, service, self._finished)
        finally:
            service.close()

    def _service(self) -> Service:
        return Service(self.url, self.token, self._stopping)

    def _supervised(self, loop: Callable[[], None], name: str) -> Callable[[], None]:
        """``loop``, started again a second after an error nobody foresaw (a bug, a proxy's
        odd answer): a helper thread that died would leave the worker idle or its leases
        unkept, silently."""

        def run() -> None:
            while True:
                try:
                    loop()
                    return
                except Exception:
                    logger.exception("the %s thread failed; starting it again in 1 s", name)
                    if self._finished.wait(1.0):
                        return

        return run

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"routemaster-{name}", daemon=True)
        thread.start()
        return thread

    def _catch_signals(self) -> Callable[[], None]:
        """SIGTERM and SIGINT drain (then stop at once) while :meth:`run` runs, when it runs on
        the main thread (signals reach no other); what to call to put the old handlers back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def caught(signum: int, _frame: FrameType | None) -> None:
            if self._draining.is_set():
                logger.warning("%s again: stopping at once", signal.Signals(signum).name)
            else:
                logger.info("%s: draining", signal.Signals(signum).name)
            self.stop()

        previous = {sig: signal.signal(sig, caught) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore


def _body(completion: Completion) -> dict[str, Any]:
    return {"id": completion.task.id, "metadata": completion.metadata}
