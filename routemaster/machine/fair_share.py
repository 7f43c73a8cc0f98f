"""Start-time fair queuing over a flow's keys (SPEC G2): which queued labels a claim takes.

Each key carries a virtual start ``vstart``. Serving one label of a key costs it
``1 / weight`` of virtual time, so over any interval in which keys stay backlogged each
is served in proportion to its weight (Goyal, Vin and Cheng's SFQ; deficit round robin
with a quantum of one call). The next label always goes to the key with the least
``vstart`` (ties by key, so every process agrees); a key below its cap with a queued
label is never passed over, so the claim is work-conserving. The flow's virtual time is
the start of the last label served: a key that becomes active again is raised to it, so
idling earns no credit. Pure: the store reads the keys and their queues' heads.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class KeyQueue(Generic[T]):
    """One key: its virtual start, weight and the heads of its queue this claim may take
    (already limited by the key's room under its cap)."""

    key: str
    vstart: float
    weight: float
    heads: list[T] = field(default_factory=list)


@dataclass
class Served(Generic[T]):
    chosen: list[T]  # in the order served
    vstarts: dict[str, float]  # the served keys' new virtual starts
    vtime: float | None  # the start of the last label served (None: none served)


def serve(
    queues: Sequence[KeyQueue[T]], slots: int, *, below: tuple[float, str] | None = None
) -> Served[T]:
    """Take up to ``slots`` heads in start-time fair order.

    ``below``: keys at or past this (vstart, key) have not been read, so serving stops
    before any key's start reaches it (the caller reads the next keys and goes on).
    """
    heap = [(q.vstart, q.key, index) for index, q in enumerate(queues) if q.heads]
    heapq.heapify(heap)
    taken = {q.key: 0 for q in queues}
    chosen: list[T] = []
    vstarts: dict[str, float] = {}
    vtime: float | None = None
    while heap and len(chosen) < slots:
        vstart, key, index = heap[0]
        if below is not None and (vstart, key) >= below:
            break
        heapq.heappop(heap)
        queue = queues[index]
        chosen.append(queue.heads[taken[key]])
        taken[key] += 1
        vtime = vstart
        finish = vstart + 1.0 / max(queue.weight, 1.0)
        vstarts[key] = finish
        if taken[key] < len(queue.heads):
            heapq.heappush(heap, (finish, key, index))
    for queue in queues:  # keep what is left for the next batch of keys
        queue.heads = queue.heads[taken[queue.key] :]
        if queue.key in vstarts:
            queue.vstart = vstarts[queue.key]
    return Served(chosen, vstarts, vtime)
