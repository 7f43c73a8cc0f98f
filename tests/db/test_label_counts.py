"""Kept label counts stay exact: the counts folded from history plus the history since equal the
labels counted one by one, whatever wrote the changes and however the folds interleave."""

from __future__ import annotations

import datetime
import re
import threading

import sqlalchemy as sa

from routemaster.db import counts, label_counts, retention, transitions
from routemaster.db import labels as store
from routemaster.db.horizon import Horizon
from routemaster.db.labels import Moves
from routemaster.db.upgrade import keep_counts
from tests.db.test_statement_text import STATEMENTS

NOW = datetime.datetime(2026, 11, 28, 5, 0, tzinfo=datetime.UTC)

_COUNTED = """
    SELECT state_machine, state, count(*) FROM labels WHERE NOT deleted
    GROUP BY state_machine, state
    """


def counted(engine: sa.Engine) -> dict[tuple[str, str], int]:
    """Every live label counted, one by one (what the kept counts must equal)."""
    with engine.connect() as conn:
        return {(sm, state): int(n) for sm, state, n in conn.exec_driver_sql(_COUNTED)}


def kept(engine: sa.Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        found = label_counts.kept_per_state(conn)
    assert found is not None, "counts are kept once migrated"
    return found


def fold(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return label_counts.fold(conn, Horizon.coordinator(conn))


def folded_position(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        xact, id_ = conn.exec_driver_sql(
            "SELECT CAST(CAST(xact AS text) AS bigint), id FROM label_counts_folded"
        ).one()
    return int(xact), int(id_)


def create(engine: sa.Engine, machine: str, name: str, state: str = "a") -> None:
    with engine.begin() as conn:
        assert transitions.insert(conn, machine, name, {}, state=state, now=NOW) is not None


def move(engine: sa.Engine, machine: str, name: str, *states: str) -> None:
    with engine.begin() as conn:
        label = store.lock(conn, machine, name)
        assert label is not None
        transitions.write_moves(conn, [Moves(label, states, due_at=None)], now=NOW)


def assert_exact(engine: sa.Engine) -> None:
    assert kept(engine) == counted(engine)


def test_counts_stay_exact_through_creates_moves_deletes_errors_and_renames(
    db_engine: sa.Engine,
) -> None:
    for i in range(6):
        create(db_engine, "m", f"l{i}")
    create(db_engine, "other", "x", state="start")
    assert kept(db_engine) == {("m", "a"): 6, ("other", "start"): 1}  # all in the tail

    move(db_engine, "m", "l0", "b")
    move(db_engine, "m", "l1", "b", "c")  # two moves in one statement
    with db_engine.begin() as conn:  # a batch of labels moving together
        batch = [store.lock(conn, "m", name) for name in ("l2", "l3")]
        transitions.write_moves(
            conn, [Moves(label, ("b",), due_at=None) for label in batch if label], now=NOW
        )
    assert_exact(db_engine)
    assert fold(db_engine) > 0
    assert_exact(db_engine)

    with db_engine.begin() as conn:
        assert transitions.soft_delete(conn, "m", "l4", now=NOW) == "a"
        assert transitions.soft_delete(conn, "m", "l4", now=NOW) is None  # deleted once
        label = store.get(conn, "m", "l5")
        assert label is not None
        transitions.become_errored(
            conn, [transitions.Erring("m", "l5", label.entry_id, "boom")], now=NOW
        )
        transitions.record_forced(conn, label, now=NOW, reason="a note")  # no state change
    assert_exact(db_engine)
    with db_engine.begin() as conn:  # a configuration's migration renames a state
        renamed = transitions.rename_batch(
            conn, "m", "b", "beta", reason="renamed", now=NOW, limit=100
        )
    assert renamed == 3
    assert_exact(db_engine)
    fold(db_engine)
    assert kept(db_engine) == {
        ("m", "a"): 1,
        ("m", "beta"): 3,
        ("m", "c"): 1,
        ("other", "start"): 1,
    }
    assert_exact(db_engine)
    assert fold(db_engine) == 0  # nothing new: nothing folded twice
    assert_exact(db_engine)


def test_the_machine_page_counts_and_errored_come_from_the_kept_counts(
    db_engine: sa.Engine,
) -> None:
    for i in range(3):
        create(db_engine, "m", f"l{i}")
    fold(db_engine)
    move(db_engine, "m", "l0", "b")
    with db_engine.begin() as conn:
        label = store.get(conn, "m", "l1")
        assert label is not None
        transitions.become_errored(
            conn, [transitions.Erring("m", "l1", label.entry_id, "boom")], now=NOW
        )
    with db_engine.connect() as conn:
        found = counts.in_machine(conn, "m")
        assert counts.per_state(conn) == {("m", "a"): 2, ("m", "b"): 1}
    assert found == {"a": counts.StateCount(2, 1), "b": counts.StateCount(1, 0)}


def test_removing_deleted_labels_and_recreating_them_counts_each_once(
    db_engine: sa.Engine,
) -> None:
    create(db_engine, "m", "gone")
    create(db_engine, "m", "kept")
    with db_engine.begin() as conn:
        transitions.soft_delete(conn, "m", "gone", now=NOW)
    fold(db_engine)
    assert_exact(db_engine)
    with db_engine.begin() as conn:  # retention: the row and its whole history removed
        pruned = retention.remove_deleted(
            conn, "m", cutoff=NOW + datetime.timedelta(days=1), batch=10
        )
    assert pruned.labels == 1
    assert_exact(db_engine)
    create(db_engine, "m", "gone")  # the name is free again
    assert kept(db_engine) == {("m", "a"): 2}
    fold(db_engine)
    assert_exact(db_engine)


def test_a_transaction_open_across_folds_is_counted_once_it_commits(
    db_engine: sa.Engine,
) -> None:
    for i in range(4):
        create(db_engine, "m", f"l{i}")
    fold(db_engine)
    with db_engine.connect() as long:
        long.begin()
        label = store.lock(long, "m", "l0")
        assert label is not None
        transitions.write_moves(long, [Moves(label, ("b",), due_at=None)], now=NOW)
        held = int(long.exec_driver_sql("SELECT CAST(pg_current_xact_id() AS text)").scalar_one())
        # Later transactions commit and are folded around it: the fold stops below it.
        move(db_engine, "m", "l1", "c")
        create(db_engine, "m", "l9")
        fold(db_engine)
        assert folded_position(db_engine)[0] <= held
        assert kept(db_engine) == {("m", "a"): 4, ("m", "c"): 1} == counted(db_engine)
        long.commit()
    assert kept(db_engine) == {("m", "a"): 3, ("m", "b"): 1, ("m", "c"): 1}
    assert_exact(db_engine)
    fold(db_engine)
    assert folded_position(db_engine)[0] > held
    assert_exact(db_engine)


def test_concurrent_folds_while_labels_move_add_every_change_once(db_engine: sa.Engine) -> None:
    names = [f"l{i}" for i in range(20)]
    for name in names:
        create(db_engine, "m", name)
    stop = threading.Event()
    errors: list[BaseException] = []
    positions: list[list[tuple[int, int]]] = [[] for _ in range(3)]

    def folder(seen: list[tuple[int, int]]) -> None:
        try:
            while not stop.is_set():
                fold(db_engine)
                seen.append(folded_position(db_engine))
        except BaseException as error:  # reported by the test
            errors.append(error)

    threads = [threading.Thread(target=folder, args=(seen,)) for seen in positions]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(5):
            for name in names:
                move(db_engine, "m", name, "b" if round_ % 2 == 0 else "a")
            assert_exact(db_engine)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors
    assert all(seen == sorted(seen) for seen in positions)  # each fold moves on, never back
    fold(db_engine)
    assert kept(db_engine) == {("m", "b"): 20} == counted(db_engine)


def test_a_recount_agrees_with_the_folds(db_engine: sa.Engine) -> None:
    for i in range(5):
        create(db_engine, "m", f"l{i}")
    move(db_engine, "m", "l0", "b")
    fold(db_engine)
    move(db_engine, "m", "l1", "b")  # after the fold: in the tail
    before = kept(db_engine)
    assert keep_counts(db_engine, recount=True)
    assert kept(db_engine) == before == counted(db_engine)
    move(db_engine, "m", "l2", "b")
    fold(db_engine)
    assert_exact(db_engine)
    assert not keep_counts(db_engine)  # kept already: nothing recounted


# The SET list of an UPDATE of labels, up to where its FROM, WHERE or RETURNING begins.
_SET_LIST = re.compile(r"UPDATE labels SET(.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b)", re.S)
_STATE_OR_DELETED = re.compile(r"(?:^|,)\s*(state|deleted)\s*=")  # an assignment, not a test
# On Citus a create and a delete are each two router statements in one transaction: the
# label's row, then its history entry (db/transitions.append_one).
_CREATE_THEN_ENTRY = {
    "transitions._INSERT_LABEL",
    "transitions._MARK_DELETED",
    "transitions._MOVE_ONE_LABEL",  # on a Citus node, after its history row (_MOVE_ONE_ENTRY)
}


def test_every_statement_that_changes_a_labels_state_appends_its_history_row() -> None:
    """The kept counts follow history: a statement that creates a label, changes its state or
    deletes it writes the history row in the same statement (nothing changes one unseen)."""
    changing = []
    for name, sql in STATEMENTS:
        creates = "INSERT INTO labels" in sql
        sets = [found for found in _SET_LIST.findall(sql) if _STATE_OR_DELETED.search(found)]
        if creates or sets:
            changing.append(name)
            if name not in _CREATE_THEN_ENTRY:
                assert "INSERT INTO history" in sql, f"{name} changes labels without history"
    assert {"transitions._MOVE_ONE", "transitions._MOVE_MANY", "transitions._DELETE"} <= set(
        changing
    )
    assert {"transitions._RENAME", "transitions._RENAME_ONE"} <= set(changing)
    # History is appended in one home: every statement writing it is a transition's.
    writers = {name for name, sql in STATEMENTS if "INSERT INTO history" in sql}
    assert writers and all(name.startswith("transitions.") for name in writers), writers


def test_a_fold_committing_between_a_reads_two_statements_counts_nothing_twice(
    db_engine: sa.Engine,
) -> None:
    for i in range(3):
        create(db_engine, "m", f"l{i}")
    move(db_engine, "m", "l0", "b")
    folded: list[int] = []

    def fold_first(conn: sa.Connection, cursor: object, statement: str, *_: object) -> None:
        # Just before the read's second statement (the history after the position it read).
        if "GROUP BY h.state_machine" in statement and not folded:
            folded.append(-1)
            folded[0] = fold(db_engine)

    sa.event.listen(db_engine, "before_cursor_execute", fold_first)
    try:
        found = kept(db_engine)
    finally:
        sa.event.remove(db_engine, "before_cursor_execute", fold_first)
    assert folded[0] > 0, "the fold ran between the read's statements and folded rows"
    assert found == {("m", "a"): 2, ("m", "b"): 1} == counted(db_engine)
