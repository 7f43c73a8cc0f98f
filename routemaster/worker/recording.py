"""The worker's part of the delivery log: what each call came to, written with what it did.

A call's entry is written in the one transaction that records what the call
did to its label, so the log never lags the label and a crash cannot
separate them: a failed call's by its slot, with the retry, the errored mark
or the probe put back (:mod:`~routemaster.worker.delivery`); a 202 that
became a task with the task's hold (:mod:`~routemaster.worker.callbacks`);
a delivered call's by the loop, in the transaction that moves the delivered
labels on (many labels, one statement for their entries). Between the slot
and that transaction the entry waits here, in memory: a worker killed then
has moved neither the label nor written the entry, and the label is
delivered again once its lease runs out. The writing is the service's
(:mod:`routemaster.service.delivery_outcomes`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from routemaster.service.in_flight import Claim
from routemaster.service.reads import Delivery

Delivered = tuple[Claim, Delivery]


class Recorder:
    """Delivered calls between their slot and the loop's transaction that moves their labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delivered: dict[tuple[str, str, int], Delivery] = {}
        self._unwritten: list[Delivered] = []  # taken once, but their transaction failed
        self._failures = 0

    def delivered(self, claim: Claim, entry: Delivery) -> None:
        """A slot's call was answered 2xx: the loop writes ``entry`` when it moves the label."""
        with self._lock:
            self._delivered[claim.entry] = entry

    def take(self, claims: Sequence[Claim]) -> list[Delivered]:
        """The delivered ``claims`` with their entries."""
        with self._lock:
            return [(claim, self._delivered.pop(claim.entry)) for claim in claims]

    def restore(self, taken: Sequence[Delivered]) -> None:
        """What :meth:`take` gave, not written (its transaction failed): for
        :meth:`take_unwritten`."""
        with self._lock:
            self._unwritten[:0] = taken

    def take_unwritten(self) -> list[Delivered]:
        """Delivered calls whose labels' move failed, to be tried again."""
        with self._lock:
            taken, self._unwritten = self._unwritten, []
        return taken

    def failed(self) -> None:
        """A call failed (and was recorded by its slot): receivers' states may have changed."""
        with self._lock:
            self._failures += 1

    def take_failures(self) -> int:
        with self._lock:
            failures, self._failures = self._failures, 0
        return failures
