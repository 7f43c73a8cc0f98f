"""What a handler is given (:class:`Task`), and what it raises to fail a task (:class:`Fail`)."""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass, field
from typing import Any


class Fail(Exception):
    """Raised by a handler: fail the task with this message.

    With ``retry=True`` (the default) the label is retried after the action's
    backoff (or after ``retry_after`` seconds) and errored after its
    ``max_attempts``; with ``retry=False`` it is errored at once.
    """

    def __init__(
        self, message: str, *, retry: bool = True, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry = retry
        self.retry_after = retry_after


@dataclass(frozen=True)
class Task:
    """One claimed task: a label waiting in a pull action, leased to this worker.

    ``lease_lost`` turns true once the service has refused a heartbeat (the
    lease ran out, or an operator moved the label): a long handler may check
    it and stop early, since its result will be dropped anyway.
    """

    id: str
    label: str
    state_machine: str
    state: str
    metadata: dict[str, Any]
    attempt: int
    idempotency_token: str
    lease_expires_at: datetime.datetime
    _lost: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def lease_lost(self) -> bool:
        return self._lost.is_set()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Task:
        return cls(
            id=body["id"],
            label=body["label"],
            state_machine=body["state_machine"],
            state=body["state"],
            metadata=body.get("metadata") or {},
            attempt=body["attempt"],
            idempotency_token=body["idempotency_token"],
            lease_expires_at=datetime.datetime.fromisoformat(body["lease_expires_at"]),
        )


@dataclass(frozen=True)
class Completion:
    """A handler's success: the metadata to merge into the label."""

    task: Task
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Failure:
    """A handler's failure: the ``/tasks/{id}/fail`` body."""

    task: Task
    error: str
    retry: bool
    retry_after: float | None = None


Outcome = Completion | Failure
