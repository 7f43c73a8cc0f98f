"""What one worker holds, under one lock: its leases, its busy slots, the outcomes to send.

Each task claimed is :class:`Held` from its claim until the service has
answered its completion, failure or release: heartbeats keep its lease
alive all that time, also while its outcome waits for an unreachable
service. A held task is ``running`` while its handler runs, ``finished``
once its outcome is queued, ``sending`` while a sender has it (no heartbeat
then: the completion may have landed already), ``dropped`` when its outcome must never be sent
(its lease was lost, or it was released at shutdown while its handler still
ran). Only a ``running`` task's handler may queue an outcome, once; that is
what keeps a result from landing after its lease was lost or given back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from routemaster.client.service import expiry_in
from routemaster.client.task import Completion, Failure, Outcome, Task

T = TypeVar("T")

BEAT_FRACTION = 1 / 3  # heartbeat when this share of the lease has passed


@dataclass
class Held:
    """One leased task and when its lease runs out by this worker's reckoning (monotonic)."""

    task: Task
    deadline: float
    beat_at: float
    state: str = "running"  # running, finished, sending, dropped

    def extended(self, remaining: float, now: float) -> None:
        """A claim or heartbeat just set the lease to run ``remaining`` more seconds."""
        self.deadline = now + remaining
        self.beat_at = now + remaining * BEAT_FRACTION


class Book:
    """The worker's shared state. Every method takes the one lock; ``changed`` is notified on
    every change that frees something (a slot freed, an outcome queued, a lease ended, a stop
    asked), ``leased`` when a lease is added (what the heartbeat thread waits for)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.leased = threading.Condition(self.lock)  # a lease added: only the heartbeats wait
        self.held: dict[str, Held] = {}
        self.busy = 0  # handlers running
        self.outcomes: list[Outcome] = []

    @property
    def free(self) -> int:
        return self.concurrency - self.busy

    def take(self, task: Task) -> Held:
        """A task just claimed: held, its slot busy."""
        now = time.monotonic()
        held = Held(task, deadline=now, beat_at=now)
        held.extended(expiry_in(task.lease_expires_at), now)
        with self.changed:
            self.held[task.id] = held
            self.busy += 1
            self.leased.notify_all()
        return held

    def finish(self, held: Held, outcome: Outcome) -> bool:
        """A handler returned: queue its outcome if its task is still ours to finish (whether
        it was), and free its slot either way."""
        with self.changed:
            self.busy -= 1
            queued = held.state == "running"
            if queued:
                held.state = "finished"
                self.outcomes.append(outcome)
            self.changed.notify_all()
            return queued

    def lose(self, task_id: str) -> str | None:
        """The service says the lease is over: never send this task's outcome; forget it.
        The state it was in (``None``: no longer held)."""
        with self.changed:
            held = self.held.pop(task_id, None)
            if held is None:
                return None
            was = held.state
            held.task._lost.set()
            if held.state == "running":
                held.state = "dropped"
            self.changed.notify_all()
            return was

    def end(self, task_id: str) -> None:
        """The service answered this task's completion, failure or release: no lease left."""
        with self.changed:
            self.held.pop(task_id, None)
            self.changed.notify_all()

    def take_outcomes(self, limit: int, kind: type[T]) -> list[T]:
        """Up to ``limit`` queued outcomes of ``kind``, now this caller's to send."""
        with self.changed:
            taken: list[T] = []
            for outcome in self.outcomes:
                if isinstance(outcome, kind) and len(taken) < limit:
                    taken.append(outcome)
            chosen = {id(o) for o in taken}
            self.outcomes = [o for o in self.outcomes if id(o) not in chosen]
            for outcome in self.outcomes_among(taken):
                self._mark(outcome, "sending")
            return taken

    def give_back(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes a sender could not send: queued again, ahead of the others."""
        with self.changed:
            self.outcomes[:0] = outcomes
            for outcome in outcomes:
                self._mark(outcome, "finished")
            self.changed.notify_all()

    @staticmethod
    def outcomes_among(items: Sequence[object]) -> list[Outcome]:
        return [item for item in items if isinstance(item, Completion | Failure)]

    def _mark(self, outcome: Outcome, state: str) -> None:
        held = self.held.get(outcome.task.id)
        if held is not None:
            held.state = state

    def running(self) -> list[Held]:
        """Tasks whose handlers still run, now ``dropped``: released at shutdown, their results
        never sent."""
        with self.changed:
            stopped = [held for held in self.held.values() if held.state == "running"]
            for held in stopped:
                held.state = "dropped"
            return stopped

    def wait_for(self, condition: Callable[[], bool], timeout: float | None) -> bool:
        """Until ``condition()`` (called under the lock) holds or ``timeout`` passes."""
        with self.changed:
            return self.changed.wait_for(condition, timeout)
