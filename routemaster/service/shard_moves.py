"""A transaction that a shard move cut short, run again (Citus).

On Citus a statement that Citus runs in steps (a pull claim's CTEs) fails when
a shard move commits while it waits for the shard's lock: its later step runs
on the shard's new node, where the earlier step's rows were never sent
(:attr:`~routemaster.db.errors.Kind.MOVED`). Citus rolls the transaction back,
and the same transaction run again is planned on the new placement. So a
request whose work is one transaction with nothing done before it (a pull
claim, a task's completion) is run again here, and an operator rebalancing
under traffic is not seen by clients; any other request cut short so answers
503 with ``Retry-After`` (:mod:`routemaster.webcore.error_responses`).

Nothing waits between attempts: by the time the error is raised the move has
committed (the statement was waiting for it), so the next attempt sees the new
placement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from routemaster.db.errors import moved_during
from routemaster.service.database import StoreError

logger = logging.getLogger(__name__)

R = TypeVar("R")

ATTEMPTS = 3
"""Attempts in all: a second move of the same shard during one request is rare, a third
rarer still; past that the error reaches the caller (a 503 for a client)."""


def again_if_moved(transaction: Callable[[], R]) -> R:
    """``transaction()`` (one whole transaction, nothing done before it), run again if a
    shard move cuts it short, at most :data:`ATTEMPTS` times in all."""
    for _ in range(ATTEMPTS - 1):
        try:
            return transaction()
        except StoreError as error:
            if not moved_during(error):
                raise
            logger.info("a shard moved while a transaction ran; running it again")
    return transaction()
