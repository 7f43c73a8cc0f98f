"""Writers racing on one label, for the stream's per-label order (on one server and on Citus).

Two threads move one label back and forth, each from the state it finds
under the label's row lock: one locks the label first (as the worker and
the operator commands do), the other merges metadata first (as a PATCH
does, whose UPDATE takes the lock). Read in position order, the label's
history must then be one chain, each entry leaving the state the previous
one entered: a position taken before the row lock was granted would put a
later write before an earlier one.
"""

from __future__ import annotations

import datetime
import itertools
import threading
from collections.abc import Callable

import sqlalchemy as sa

from routemaster.db import labels, transitions
from routemaster.db.changes import START, Change, read_changes
from routemaster.db.horizon import Horizon
from tests.waiting import wait_until

NOW = datetime.datetime(2026, 11, 28, 5, 0, tzinfo=datetime.UTC)
OTHER = {"a": "b", "b": "a"}


def race_on_one_label(engine: sa.Engine, name: str, *, rounds: int) -> list[Change]:
    """Both writers' moves of ``name`` (machine ``m``), every change of it in stream order."""
    with engine.begin() as conn:
        assert transitions.insert(conn, "m", name, {}, state="a", now=NOW) is not None
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def locking_first() -> None:
        for _ in range(rounds):
            with engine.begin() as conn:
                label = labels.lock(conn, "m", name)
                assert label is not None
                transitions.write_moves(
                    conn, [labels.Moves(label, (OTHER[label.state],), None)], now=NOW
                )

    def merging_first() -> None:
        for n in range(rounds):
            with engine.begin() as conn:
                label = transitions.merge_metadata(conn, "m", name, {"n": n}, now=NOW)
                assert label is not None
                transitions.write_moves(
                    conn, [labels.Moves(label, (OTHER[label.state],), None)], now=NOW
                )

    def run(work: Callable[[], None]) -> None:
        try:
            start.wait(timeout=30)
            work()
        except BaseException as error:
            failures.append(error)

    threads = [
        threading.Thread(target=run, args=(work,)) for work in (locking_first, merging_first)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    changes: list[Change] = []
    reader = {"cursor": START}
    horizon = Horizon()

    def all_read() -> bool:
        with engine.connect() as conn:
            page = read_changes(conn, reader["cursor"], machine="m", limit=1000, horizon=horizon)
        changes.extend(change for change in page.changes if change.label == name)
        reader["cursor"] = page.reached
        return len(changes) > 2 * rounds  # the create and every move

    wait_until(all_read, f"the {2 * rounds + 1} changes of {name}", timeout=30, every=0.02)
    return changes


def unchained(changes: list[Change]) -> list[tuple[str, str | None, str | None]]:
    """The changes that do not leave the state the change before them entered."""
    return [
        (str(change.position), change.old_state, change.new_state)
        for before, change in itertools.pairwise(changes)
        if change.old_state != before.new_state
    ]
