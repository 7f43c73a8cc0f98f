"""When a worker's claims may skip their reads across the shards (routemaster.db.idle_shards).

Pure logic with a fake clock: what wakes a quiet claim, and what never lets one be quiet.
The same on a cluster: tests/worker/test_idle_shards_citus.py.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from routemaster.db.idle_shards import QUIET_SECONDS, IdleShards

T0 = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)
FIND = "SELECT shard_key FROM labels WHERE due_at <= %(now)s"
BULK = "SELECT shard_key FROM bulk_items"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def quiet_idle(next_due: datetime.datetime | None = None) -> tuple[IdleShards, Clock]:
    """A listening worker whose claim found nothing at T0, and its next due time read."""
    clock = Clock()
    idle = IdleShards(clock)
    idle.hearing(True)
    idle.found(FIND, T0, rows=0)
    quiet, at = idle.next_due(lambda since: next_due)
    assert quiet and at == next_due
    return idle, clock


def test_a_claim_that_found_nothing_is_quiet_once_the_next_due_time_is_read() -> None:
    clock = Clock()
    idle = IdleShards(clock)
    idle.hearing(True)
    idle.found(FIND, T0, rows=0)
    assert not idle.quiet(FIND, T0)  # the next due time after it is not known yet
    reads: list[datetime.datetime] = []

    def read(since: datetime.datetime) -> None:
        reads.append(since)

    idle.next_due(read)
    assert reads == [T0]  # read from the moment the claim found nothing
    assert idle.quiet(FIND, T0 + datetime.timedelta(seconds=5))
    assert idle.next_due(read) == (True, None)
    assert len(reads) == 1  # kept: no second read


def test_the_next_due_time_wakes_the_claim() -> None:
    idle, _ = quiet_idle(next_due=T0 + datetime.timedelta(seconds=10))
    assert idle.quiet(FIND, T0 + datetime.timedelta(seconds=9))
    assert not idle.quiet(FIND, T0 + datetime.timedelta(seconds=10))


def test_a_later_due_time_heard_lowers_the_next_due_time() -> None:
    idle, _ = quiet_idle(next_due=T0 + datetime.timedelta(seconds=60))
    idle.heard([(T0 + datetime.timedelta(seconds=3)).isoformat()])
    assert idle.quiet(FIND, T0 + datetime.timedelta(seconds=2))
    assert not idle.quiet(FIND, T0 + datetime.timedelta(seconds=3))


def test_a_due_notification_a_busy_round_or_polling_wakes_every_claim() -> None:
    wakes: list[Callable[[IdleShards], None]] = [
        lambda idle: idle.heard([""]),
        lambda idle: idle.wake(),
        lambda idle: idle.hearing(False),
    ]
    for wake in wakes:
        idle, _ = quiet_idle()
        wake(idle)
        assert not idle.quiet(FIND, T0)


def test_a_claim_is_quiet_for_a_while_at_most() -> None:
    idle, clock = quiet_idle()
    clock.now += QUIET_SECONDS
    assert not idle.quiet(FIND, T0)


def test_nothing_is_quiet_while_the_worker_polls_or_after_a_claim_found_rows() -> None:
    clock = Clock()
    idle = IdleShards(clock)
    idle.found(FIND, T0, rows=0)  # not listening
    assert idle.next_due(lambda since: None) == (False, None)
    assert not idle.quiet(FIND, T0)
    idle.hearing(True)
    idle.found(FIND, T0, rows=0)
    idle.next_due(lambda since: None)
    idle.found(FIND, T0, rows=3)
    assert not idle.quiet(FIND, T0)


def test_a_claim_of_work_without_a_due_time_waits_for_a_notification() -> None:
    clock = Clock()
    idle = IdleShards(clock)
    idle.hearing(True)
    idle.found(BULK, None, rows=0)
    assert idle.quiet(BULK, None)  # no next due time needed
    assert idle.next_due(lambda since: None) == (False, None)  # read as on one server
    idle.heard([""])
    assert not idle.quiet(BULK, None)
