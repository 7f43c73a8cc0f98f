"""A writer that first reaches a label waits for its other writers before it has a
transaction id (on one server), so the changes stream gives one label's changes in the
order they were made (docs/architecture.md, "Order within one label")."""

from __future__ import annotations

import datetime
import threading
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from routemaster.db import bulk, label_claims, tasks, transitions
from routemaster.db import labels as store
from routemaster.db.catalogue import EACH_LABEL
from routemaster.db.claimed import Claim
from routemaster.db.search import Search
from routemaster.db.tasks import Lease
from tests.citus_cluster import citus_run
from tests.db.test_statement_text import STATEMENTS
from tests.waiting import wait_until

NOW = datetime.datetime(2026, 11, 28, 6, 0, tzinfo=datetime.UTC)

pytestmark = pytest.mark.skipif(
    citus_run(), reason="on one server: on Citus the coordinator takes the id after the row lock"
)

Write = Callable[[sa.Connection, store.Label], object]

WRITERS: dict[str, Write] = {
    "lock (worker, operator)": lambda conn, label: store.lock(conn, "m", label.name),
    "metadata merge (PATCH)": lambda conn, label: transitions.merge_metadata(
        conn, "m", label.name, {"n": 1}, now=NOW
    ),
    "delete": lambda conn, label: transitions.soft_delete(conn, "m", label.name, now=NOW),
    "delivered labels": lambda conn, label: label_claims.lock_entries(
        conn, [("m", label.name, label.entry_id), ("m", "other", 1)]
    ),
    "failed delivery given up": lambda conn, label: transitions.mark_errored(
        conn, Claim("m", label.name, label.state, {}, label.entry_id, 3), error="gone", now=NOW
    ),
    "retry (operator, receiver's errored labels)": lambda conn, label: transitions.retry(
        conn, [("m", "other"), ("m", label.name)], now=NOW, reason="retried"
    ),
}

ERRORED_FIRST = {"retry (operator, receiver's errored labels)"}
"""Writers of an errored label: the label is errored before it is raced."""


@pytest.mark.parametrize("writer", WRITERS)
def test_a_writer_waits_for_the_label_before_it_takes_a_transaction_id(
    db_engine: sa.Engine, writer: str
) -> None:
    with db_engine.begin() as conn:
        label = transitions.insert(conn, "m", "raced", {}, state="a", now=NOW)
        assert label is not None
        if writer in ERRORED_FIRST:
            erring = transitions.Erring("m", "raced", label.entry_id, "failed")
            assert transitions.become_errored(conn, [erring], now=NOW)
    waiter: dict[str, object] = {}

    def write() -> None:
        try:
            with db_engine.begin() as conn:
                waiter["pid"] = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                WRITERS[writer](conn, label)
        except BaseException as error:
            waiter["error"] = error

    with db_engine.connect() as holder, holder.begin():
        store.lock(holder, "m", "raced")
        transitions.merge_metadata(holder, "m", "raced", {"held": True}, now=NOW)  # has an id
        thread = threading.Thread(target=write)
        thread.start()

        def waiting_without_an_id() -> tuple[object, ...] | None:
            if "pid" not in waiter:
                return None
            row = holder.exec_driver_sql(
                "SELECT wait_event_type, backend_xid FROM pg_stat_activity WHERE pid = %(pid)s",
                {"pid": waiter["pid"]},
            ).one()
            return tuple(row) if row[0] == "Lock" else None

        state = wait_until(waiting_without_an_id, f"the {writer} waiting", timeout=10)
        assert state == ("Lock", None)
    thread.join(timeout=10)
    assert "error" not in waiter, waiter


def _waiting(conn: sa.Connection, pid: object) -> bool:
    row = conn.exec_driver_sql(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %(pid)s", {"pid": pid}
    ).one()
    return bool(row[0] == "Lock")


def test_a_task_completion_and_a_patch_of_its_label_wait_for_each_other_in_turn(
    db_engine: sa.Engine,
) -> None:
    """A pull task's completion ends the lease, holding the label, then merges its patch; a
    PATCH of the label meanwhile waits for the whole completion, and the completion never
    waits for the PATCH (which would be a deadlock)."""
    with db_engine.begin() as conn:
        assert transitions.insert(conn, "m", "pulled", {}, state="pull", now=NOW, due=True)
        [task] = label_claims.claim_tasks(
            conn,
            [("m", "pull", Lease(30, "fixed", 0))],
            ids=[uuid.uuid4().hex],
            worker="w",
            now=NOW,
        )
    patcher: dict[str, object] = {}

    def patch() -> None:
        try:
            with db_engine.begin() as conn:
                patcher["pid"] = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                transitions.merge_metadata(conn, "m", "pulled", {"by": "patch"}, now=NOW)
        except BaseException as error:
            patcher["error"] = error

    with db_engine.connect() as completing, completing.begin():
        assert tasks.end_task(completing, task.id, outcome="completed", now=NOW) is not None
        thread = threading.Thread(target=patch)
        thread.start()
        wait_until(
            lambda: "pid" in patcher and _waiting(completing, patcher["pid"]), "the PATCH waiting"
        )
        merged = transitions.merge_metadata(completing, "m", "pulled", {"by": "task"}, now=NOW)
        assert merged is not None
    thread.join(timeout=10)
    assert "error" not in patcher, patcher
    with db_engine.connect() as conn:
        label = store.get(conn, "m", "pulled")
    assert label is not None and label.metadata == {"by": "patch"}


SERIALISE_SEVERAL = " ".join(EACH_LABEL.split())
"""The condition of routemaster/db/catalogue.py, whitespace aside."""


def test_every_statement_that_serialises_several_labels_takes_their_locks_in_one_order() -> None:
    """Two statements taking several labels' locks in different orders could each hold one
    the other waits for: every one takes them by the labels' two keys, all before its rows."""
    several = {
        name: " ".join(sql.split())
        for name, sql in STATEMENTS
        if "pg_advisory_xact_lock" in sql and "unnest" in sql.split("pg_advisory_xact_lock")[1]
    }
    assert {
        "label_claims._SERIALISED_LOCK_ENTRIES",
        "transitions._SERIALISED_ERROR_LABELS",
        "transitions._SERIALISED_RETRY",
    } <= set(several)
    for name, sql in several.items():
        assert SERIALISE_SEVERAL in sql, name


def _lock_is_free(conn: sa.Connection, name: str) -> bool:
    with conn.begin():
        return bool(
            conn.exec_driver_sql(
                "SELECT pg_try_advisory_xact_lock(hashtext('m'), hashtext(%(name)s))",
                {"name": name},
            ).scalar_one()
        )


def test_a_bulk_batch_serialises_its_labels_before_it_claims_their_items(
    db_engine: sa.Engine,
) -> None:
    """A batch claims its items (which takes its transaction id) holding its labels' locks
    already; an item whose label is being written is left for a later batch."""
    with db_engine.begin() as conn:
        for name in ("free", "raced", "spare"):
            assert transitions.insert(conn, "m", name, {}, state="a", now=NOW)
        bulk.accept_job(conn, Search("m"), command="retry", arguments="{}", reason="bulk", now=NOW)
    with db_engine.connect() as holder, holder.begin():
        transitions.merge_metadata(holder, "m", "raced", {"held": True}, now=NOW)  # has an id
        with db_engine.connect() as batch, batch.begin(), db_engine.connect() as other:
            claimed = {item.name for item in bulk.claim_items(batch, limit=10)}
            assert claimed == {"free", "spare"}
            assert not _lock_is_free(other, "free") and not _lock_is_free(other, "spare")
    with db_engine.connect() as batch, batch.begin():
        assert {item.name for item in bulk.claim_items(batch, limit=10)} == {
            "free",
            "raced",
            "spare",
        }
