"""The changes stream on Citus: a change whose second worker has not committed yet is waited for.

Runs only with ``ROUTEMASTER_TEST_CITUS_URL`` (tests/citus_cluster.py). The moment
that lost changes before the horizon was confirmed by the workers: one
transaction wrote history to two workers, the coordinator and one worker
have committed, the other worker's ``COMMIT PREPARED`` has not run. The
coordinator's own horizon is past the transaction then; the stream's must
not be.
"""

from __future__ import annotations

import datetime

import pytest
import sqlalchemy as sa

from routemaster.db import transitions
from routemaster.db.changes import (
    START,
    Change,
    Position,
    present,
    read_changes,
    recent_changes,
)
from routemaster.db.horizon import Horizon
from routemaster.db.keys import shard_key
from tests.citus_cluster import (
    Cluster,
    Node,
    rounds_pass,
    second_worker_held,
)
from tests.db.one_label_writers import race_on_one_label, unchained
from tests.db.transaction_ids import past_transaction
from tests.waiting import wait_until

NOW = datetime.datetime(2026, 11, 28, 5, 0, tzinfo=datetime.UTC)


pytestmark = pytest.mark.citus


@pytest.fixture
def engine(citus_cluster: Cluster) -> sa.Engine:
    """The session's database on the cluster (emptied before and after each test)."""
    return citus_cluster.engine


class Reader:
    """A stream reader as the hub is one: a cursor, pages from it, every change kept."""

    def __init__(
        self, engine: sa.Engine, after: Position = START, horizon: Horizon | None = None
    ) -> None:
        self.engine = engine
        self.horizon = horizon or Horizon()
        self.cursor = after
        self.changes: list[Change] = []

    def read(self) -> list[Change]:
        with self.engine.connect() as conn:
            page = read_changes(conn, self.cursor, machine=None, limit=1000, horizon=self.horizon)
        assert page.reached >= self.cursor
        self.changes += page.changes
        self.cursor = page.reached
        return page.changes

    def until(self, labels: set[str]) -> None:
        def arrived() -> bool:
            self.read()
            return labels <= {change.label for change in self.changes}

        wait_until(arrived, f"the changes of {sorted(labels)}", timeout=30, every=0.05)


def _create(conn: sa.Connection, name: str) -> None:
    assert transitions.insert(conn, "m", name, {}, state="a", now=NOW) is not None


def _visible(engine: sa.Engine, name: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql("SELECT count(*) FROM history WHERE label = %s", (name,)).scalar()
        )


def test_a_change_whose_second_worker_has_not_committed_is_waited_for_never_skipped(
    citus_cluster: Cluster, engine: sa.Engine
) -> None:
    first, second = citus_cluster.workers[:2]
    [before_1, early, late_1] = citus_cluster.names_on(first, "one", 3)
    [before_2, held, late_2] = citus_cluster.names_on(second, "two", 3)
    with engine.begin() as conn:
        _create(conn, before_1)
    with engine.begin() as conn:
        _create(conn, before_2)
    reader = Reader(engine)
    reader.until({before_1, before_2})

    with engine.connect() as writer:
        writer.begin()
        _create(writer, held)  # the lower history id, on the worker held back
        _create(writer, early)
        with second_worker_held(citus_cluster, writer, second) as moment:
            # The coordinator has committed and so has the first worker: a horizon read on
            # the coordinator alone is past the transaction, and one of its rows is missing.
            with engine.connect() as conn:
                assert Horizon.coordinator(conn) > moment.xact
            assert _visible(engine, early) and not _visible(engine, held)
            assert not moment.committed.is_set()
            with engine.begin() as conn:  # later changes, committed on both sides
                _create(conn, late_1)
            with engine.begin() as conn:
                _create(conn, late_2)

            rounds_pass(reader.horizon, 3, reader.read)
            assert reader.cursor <= Position(moment.xact, 0)
            assert {change.label for change in reader.changes} == {before_1, before_2}
            assert not _visible(engine, held)
        wait_until(moment.committed.is_set, "the writer's commit returned", timeout=30)

    reader.until({held, early, late_1, late_2})
    labels = [change.label for change in reader.changes]
    assert labels[:2] == [before_1, before_2], _shown(reader.changes)
    assert labels[2:4] == [held, early], _shown(reader.changes)  # one transaction, by id
    assert sorted(labels[4:]) == sorted([late_1, late_2]), _shown(reader.changes)
    _assert_once_in_order_and_resumable(engine, reader.changes)


def test_a_change_left_prepared_by_a_lost_connection_waits_for_citus_to_recover_it(
    citus_cluster: Cluster, engine: sa.Engine
) -> None:
    """COMMIT PREPARED fails (the worker's connection is gone): Citus commits it later."""
    first, second = citus_cluster.workers[:2]
    [early] = citus_cluster.names_on(first, "lost-one", 1)
    [held] = citus_cluster.names_on(second, "lost-two", 1)
    reader = Reader(engine)
    reader.read()

    with engine.connect() as writer:
        writer.begin()
        _create(writer, held)
        _create(writer, early)
        with second_worker_held(citus_cluster, writer, second, lose=True) as moment:
            wait_until(moment.committed.is_set, "the writer's commit returned", timeout=30)
            assert _visible(engine, early)
            rounds_pass(reader.horizon, 3, reader.read)
            if _prepared(citus_cluster, second):  # (unless Citus's daemon recovered it meanwhile)
                assert not _visible(engine, held)
                assert reader.cursor <= Position(moment.xact, 0)
                assert not reader.changes
    citus_cluster.query(citus_cluster.coordinator, "SELECT recover_prepared_transactions()")
    reader.until({held, early})
    assert [change.label for change in reader.changes] == [held, early]
    _assert_once_in_order_and_resumable(engine, reader.changes)


def _shown(changes: list[Change]) -> str:
    return ", ".join(f"{change.label} at {change.position}" for change in changes)


def _prepared(cluster: Cluster, worker: Node) -> bool:
    return bool(cluster.query(worker, "SELECT 1 FROM pg_prepared_xacts"))


def _assert_once_in_order_and_resumable(engine: sa.Engine, changes: list[Change]) -> None:
    """Every change once, in position order, and a stream resumed after any of them gets
    exactly the ones after it (the whole stream read afresh is the same list)."""
    positions = [change.position for change in changes]
    assert positions == sorted(set(positions))
    everything = Reader(engine)
    everything.until({change.label for change in changes})
    assert [change.position for change in everything.changes] == positions
    for index, change in enumerate(changes):
        resumed = Reader(engine, change.position)
        resumed.read()
        assert [found.position for found in resumed.changes] == positions[index + 1 :]


def test_a_stream_started_now_on_citus_leaves_out_what_committed_before_while_a_transaction_is_open(
    engine: sa.Engine,
) -> None:
    with engine.connect() as other, other.begin():  # an older transaction, open throughout
        other.exec_driver_sql("SELECT pg_current_xact_id()")
        with engine.begin() as conn:
            _create(conn, "old")
        with engine.connect() as conn:
            here = present(conn)
            assert here > Position(Horizon.coordinator(conn), 0)
    with engine.begin() as conn:
        _create(conn, "new")
    reader = Reader(engine, here)
    reader.until({"new"})
    assert "old" not in {change.label for change in reader.changes}


def test_a_stream_that_has_caught_up_asks_the_workers_nothing(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        _create(conn, "idle")
    # A clock that stands still: one confirmed horizon for the whole test (on a busy cluster
    # every new one lets the reader look again, as it should).
    reader = Reader(engine, horizon=Horizon(clock=lambda: 0.0))
    reader.until({"idle"})
    statements: list[str] = []

    def seen(*args: object) -> None:
        statements.append(str(args[2]))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        for _ in range(5):
            assert reader.read() == []
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert not [statement for statement in statements if "history" in statement]


def test_positions_past_a_power_of_ten_come_out_in_numeric_order_from_every_worker(
    citus_cluster: Cluster, engine: sa.Engine
) -> None:
    """Each shard and the coordinator's merge sort transaction ids as numbers: sorted as text
    (the worker's query once ordered by the text it returned), 1000 came before 999 and a
    reader that resumed after 1000 lost 999 for good."""
    past_transaction(engine, 1000)  # every position below written is below the horizon
    first, second = citus_cluster.workers[:2]
    at = dict(zip(citus_cluster.names_on(first, "x", 3), [1000, 9, 99], strict=True))
    at |= dict(zip(citus_cluster.names_on(second, "x", 3), [999, 100, 10], strict=True))
    with engine.begin() as conn:
        for name, xact in at.items():
            conn.execute(
                _HISTORY_AT,
                {"shard_key": shard_key(name), "label": name, "now": NOW, "xact": str(xact)},
            )
    reader = Reader(engine)
    reader.until(set(at))
    assert [change.position.xact for change in reader.changes] == sorted(at.values())
    with engine.connect() as conn:
        recent = recent_changes(conn, "m", limit=3)
    assert [change.position.xact for change in recent] == [1000, 999, 100]


_HISTORY_AT = sa.text(
    "INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created,"
    " xact_id) VALUES (:shard_key, 'm', :label, NULL, 'a', :now, CAST(:xact AS xid8))"
)


def test_two_writers_on_one_label_come_out_in_the_order_they_wrote_on_citus(
    engine: sa.Engine,
) -> None:
    """The coordinator takes a change's position after the worker granted the label's row
    lock (every write of one label locks it before its history row names the transaction)."""
    changes = race_on_one_label(engine, "raced", rounds=40)
    assert [change.position for change in changes] == sorted(c.position for c in changes)
    assert not unchained(changes)
