"""The changes query: every history entry once, in an order that commit races cannot break."""

from __future__ import annotations

import datetime
import random
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from routemaster.db import changes, transitions
from routemaster.db import labels as store
from routemaster.db.changes import START, Page, Position, read_changes
from routemaster.db.horizon import Horizon
from routemaster.db.keys import shard_key
from routemaster.db.statements import fetch_all
from tests.citus_cluster import citus_run
from tests.db.one_label_writers import race_on_one_label, unchained
from tests.db.transaction_ids import past_transaction
from tests.waiting import wait_until

NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.UTC)


def _create(conn: sa.Connection, name: str, machine: str = "m") -> store.Label:
    label = transitions.insert(conn, machine, name, {}, state="a", now=NOW, due=False)
    assert label is not None
    return label


def _read_all(engine: sa.Engine, after: Position, *, machine: str | None = None) -> Page:
    with engine.connect() as conn:
        return read_changes(conn, after, machine=machine, limit=1000, horizon=Horizon())


def _read_once_visible(
    engine: sa.Engine, after: Position, count: int, *, machine: str | None = None
) -> Page:
    """The changes after ``after`` once ``count`` are readable.

    The horizon is server-wide: another database's transaction that was
    running when ours committed holds our changes back until it ends.
    """

    def visible() -> Page | None:
        page = _read_all(engine, after, machine=machine)
        return page if len(page.changes) >= count else None

    return wait_until(visible, f"{count} changes readable", timeout=20, every=0.01)


def _history_ids(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM history ORDER BY id")).scalars())


@pytest.fixture
def open_transactions(db_engine: sa.Engine) -> Iterator[list[sa.Connection]]:
    """Connections a test leaves open are closed even when it fails (they hold locks)."""
    connections: list[sa.Connection] = []
    yield connections
    for conn in connections:
        conn.close()


def test_positions_round_trip_and_compare_as_pairs() -> None:
    assert Position.parse("12-345") == Position(12, 345)
    assert str(Position(12, 345)) == "12-345"
    assert Position(2, 900) < Position(10, 1)
    for bad in ("", "12", "a-b", "-1-2", "1-2-3", "1" * 20 + "-1"):
        with pytest.raises(ValueError):
            Position.parse(bad)


def test_created_moved_forced_and_deleted_entries_come_out_with_their_kind(
    db_engine: sa.Engine,
) -> None:
    with db_engine.begin() as conn:
        label = _create(conn, "ann")
        [label] = transitions.write_moves(conn, [store.Moves(label, ("b",), None)], now=NOW)
        transitions.record_forced(conn, label, now=NOW, reason="paused")
        transitions.soft_delete(conn, "m", "ann", now=NOW)
    page = _read_once_visible(db_engine, START, 4)
    assert [(c.kind, c.old_state, c.new_state, c.reason) for c in page.changes] == [
        ("created", None, "a", None),
        ("moved", "a", "b", None),
        ("forced", "b", "b", "paused"),
        ("deleted", "b", None, "deleted"),
    ]
    assert {c.label for c in page.changes} == {"ann"}
    assert [c.position for c in page.changes] == sorted(c.position for c in page.changes)
    assert _read_all(db_engine, page.reached).changes == []


def test_a_machine_filter_returns_only_that_machine(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        _create(conn, "x", machine="one")
        _create(conn, "y", machine="two")
    _read_once_visible(db_engine, START, 2)
    only = _read_all(db_engine, START, machine="two")
    assert [(c.state_machine, c.label) for c in only.changes] == [("two", "y")]


def test_pages_resume_exactly_after_the_last_position(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        for n in range(7):
            _create(conn, f"l{n}")
    _read_once_visible(db_engine, START, 7)
    seen: list[str] = []
    cursor = START
    for _ in range(5):
        with db_engine.connect() as conn:
            page = read_changes(conn, cursor, machine=None, limit=3, horizon=Horizon())
        seen += [c.label for c in page.changes]
        cursor = page.reached
    assert seen == [f"l{n}" for n in range(7)]


def test_a_change_committed_after_a_later_one_is_not_skipped(
    db_engine: sa.Engine, open_transactions: list[sa.Connection]
) -> None:
    """The race the transaction ids exist for, forced step by step.

    A takes the lower history id and commits last; a reader that already
    read B's change would, ordering by id alone, never see A's.
    """
    early = db_engine.connect()
    open_transactions.append(early)
    early_tx = early.begin()
    a = _create(early, "early")
    with db_engine.begin() as conn:
        b = _create(conn, "late")
    assert a.entry_id < b.entry_id

    while_open = _read_all(db_engine, START)
    assert while_open.changes == []  # B waits for A: A's transaction is still running

    early_tx.commit()
    early.close()
    after = _read_once_visible(db_engine, while_open.reached, 2)
    assert [c.label for c in after.changes] == ["early", "late"]


def test_a_rolled_back_writer_holds_nothing_back_once_it_is_gone(
    db_engine: sa.Engine, open_transactions: list[sa.Connection]
) -> None:
    doomed = db_engine.connect()
    open_transactions.append(doomed)
    doomed_tx = doomed.begin()
    _create(doomed, "never")
    with db_engine.begin() as conn:
        _create(conn, "kept")
    assert _read_all(db_engine, START).changes == []
    doomed_tx.rollback()
    doomed.close()
    assert [c.label for c in _read_once_visible(db_engine, START, 1).changes] == ["kept"]


def test_concurrent_writers_committing_out_of_order_are_read_once_each_in_a_fixed_order(
    db_engine: sa.Engine, open_transactions: list[sa.Connection]
) -> None:
    """Rounds of writers that commit in a shuffled order while a reader keeps resuming.

    The reader reads small pages and always resumes from the last position
    it returned, as a client reconnecting with Last-Event-ID does. In the
    end it has every history row exactly once, and no row ever arrived
    after a row with a higher position.
    """
    rng = random.Random(14)
    expected: list[int] = []  # set once every writer is done
    deadline = threading.Event()
    received: list[tuple[Position, int]] = []
    failures: list[BaseException] = []

    def reader() -> None:
        cursor = START
        try:
            while not deadline.is_set():
                if expected and len(received) >= len(expected):
                    return
                with db_engine.connect() as conn:
                    page = read_changes(conn, cursor, machine=None, limit=5, horizon=Horizon())
                received.extend((c.position, c.position.id) for c in page.changes)
                cursor = page.reached
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_number in range(12):
            writers: list[tuple[sa.Connection, sa.RootTransaction]] = []
            for n in range(6):
                conn = db_engine.connect()
                open_transactions.append(conn)
                transaction = conn.begin()
                label = _create(conn, f"r{round_number}-{n}")
                if n % 2:
                    transitions.write_moves(conn, [store.Moves(label, ("b", "c"), None)], now=NOW)
                writers.append((conn, transaction))
            rng.shuffle(writers)
            for conn, transaction in writers:
                if rng.random() < 0.15:
                    transaction.rollback()
                else:
                    transaction.commit()
                conn.close()
        expected.extend(_history_ids(db_engine))
        thread.join(timeout=60)
    finally:
        deadline.set()
        thread.join(timeout=10)
    assert not failures
    positions = [position for position, _ in received]
    assert positions == sorted(positions)
    ids = [history_id for _, history_id in received]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == expected


def test_a_long_transaction_in_another_database_holds_nothing_back(
    db_engine: sa.Engine, database_url: str
) -> None:
    """The server-wide horizon would wait for it; it cannot have written our history."""
    elsewhere = sa.create_engine(
        sa.engine.make_url(database_url).set(database="postgres"), poolclass=sa.pool.NullPool
    )
    try:
        with elsewhere.connect() as other:
            other.execute(sa.text("SELECT pg_current_xact_id()"))  # holds a transaction id
            with db_engine.begin() as conn:
                _create(conn, "not-held")
            page = _read_once_visible(db_engine, START, 1)
            assert [c.label for c in page.changes] == ["not-held"]
            other.rollback()
    finally:
        elsewhere.dispose()


ONE_SERVER_ONLY = pytest.mark.skipif(
    citus_run(),
    reason="the one-server read's shape; on Citus the read is merged across shards"
    " (tests/db/test_changes_citus.py)",
)


@ONE_SERVER_ONLY
@pytest.mark.parametrize(
    ("machine", "index"),
    [(None, "history_by_position"), ("m", "history_by_machine_position")],
)
def test_the_read_with_or_without_a_machine_has_its_own_indexs_plan(
    db_engine: sa.Engine, machine: str | None, index: str
) -> None:
    params = {"xact": "0", "id": 0, "limit": 100, "sm": machine}
    with db_engine.connect() as conn:
        plan = "\n".join(row[0] for row in fetch_all(conn, "EXPLAIN " + changes._CHANGES, params))
    assert index in plan, plan
    assert ("state_machine = " in plan) == (machine is not None), plan  # NULL: no test at all


@ONE_SERVER_ONLY
def test_on_one_server_a_read_is_still_one_statement_and_never_asks_for_workers(
    db_engine: sa.Engine,
) -> None:
    """The Citus horizon (routemaster.db.horizon) changes nothing on plain PostgreSQL."""
    horizon = Horizon()
    with db_engine.begin() as conn:
        _create(conn, "ann")
    with db_engine.connect() as conn:
        assert not horizon.distributed(conn)
    statements: list[str] = []

    def seen(*args: object) -> None:
        statements.append(str(args[2]))

    sa.event.listen(db_engine, "before_cursor_execute", seen)
    try:
        page = _read_once_visible(db_engine, START, 1)
        statements.clear()
        with db_engine.connect() as conn:
            again = read_changes(conn, START, machine=None, limit=1000, horizon=horizon)
            here = changes.horizon_position(conn, horizon)
    finally:
        sa.event.remove(db_engine, "before_cursor_execute", seen)
    assert again.changes == page.changes and [change.label for change in page.changes] == ["ann"]
    assert statements[0] == changes._CHANGES
    assert len(statements) == 2  # the read, then the position: no round of any kind
    assert here >= again.reached >= page.reached
    assert horizon.rounds.rounds == 0


_HISTORY_AT = sa.text(
    "INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created,"
    " xact_id) VALUES (:shard_key, 'm', :label, NULL, 'a', :now, CAST(:xact AS xid8))"
)


def test_positions_past_a_power_of_ten_come_out_in_numeric_order(db_engine: sa.Engine) -> None:
    """Transaction ids 9 and 10, 999 and 1000: the stream and the recent list sort them as
    numbers (sorted as text, a reader passed 999 on its way to 1000 and lost it)."""
    xacts = [1000, 9, 999, 100, 10, 99]
    past_transaction(db_engine, max(xacts))
    with db_engine.begin() as conn:
        for xact in xacts:
            label = f"x{xact}"
            conn.execute(
                _HISTORY_AT,
                {"shard_key": shard_key(label), "label": label, "now": NOW, "xact": str(xact)},
            )
    page = _read_all(db_engine, START)
    assert [change.position.xact for change in page.changes] == sorted(xacts)
    with db_engine.connect() as conn:
        recent = changes.recent_changes(conn, "m", limit=3)
    assert [change.position.xact for change in recent] == [1000, 999, 100]


def test_two_writers_on_one_label_come_out_in_the_order_they_wrote(db_engine: sa.Engine) -> None:
    changes = race_on_one_label(db_engine, "raced", rounds=40)
    assert [change.position for change in changes] == sorted(c.position for c in changes)
    assert not unchained(changes)


def _history_at(conn: sa.Connection, machine: str, label: str, xact: int) -> None:
    """A history row as transaction ``xact`` would have written it."""
    conn.execute(
        sa.text(
            "INSERT INTO history (state_machine, label, old_state, new_state, xact_id, shard_key)"
            " VALUES (:sm, :label, NULL, 'a', CAST(CAST(:xact AS text) AS xid8),"
            " routemaster_shard_key(:label))"
        ),
        {"sm": machine, "label": label, "xact": xact},
    )


def test_recent_changes_come_newest_first_in_position_order_across_a_power_of_ten(
    db_engine: sa.Engine,
) -> None:
    """Positions 9998 to 10001: as text 9999 would sort after 10000."""
    with db_engine.begin() as conn:
        for xact in (10000, 9998, 10001, 9999):
            _history_at(conn, "m", f"at-{xact}", xact)
        _history_at(conn, "m", "at-10001-again", 10001)  # same transaction: by history id
        _history_at(conn, "other", "elsewhere", 20000)
    with db_engine.connect() as conn:
        recent = changes.recent_changes(conn, "m", limit=4)
    assert [change.label for change in recent] == [
        "at-10001-again",
        "at-10001",
        "at-10000",
        "at-9999",
    ]
    assert [change.position.xact for change in recent] == [10001, 10001, 10000, 9999]


def test_recent_changes_read_backwards_along_the_machines_index_without_a_sort(
    db_engine: sa.Engine,
) -> None:
    """The cost is the rows asked for, not the history: no sort of the machine's rows.

    On Citus each shard returns its first rows (a LIMIT in each task) and the
    coordinator sorts only those.
    """
    with db_engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL enable_sort = off"))  # a plan that sorts shows a Sort still
        plan = "\n".join(
            row[0]
            for row in fetch_all(conn, "EXPLAIN " + changes._RECENT, {"sm": "m", "limit": 20})
        )
    assert "history_by_machine_position" in plan, plan
    if citus_run():
        assert plan.count("Limit") == 2, plan  # the coordinator's, and each shard's
    else:
        assert "Index Scan Backward using history_by_machine_position" in plan, plan
        assert "Sort" not in plan, plan
