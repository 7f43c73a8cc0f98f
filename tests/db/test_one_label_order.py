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

from routemaster.db import label_claims, tasks, transitions
from routemaster.db import labels as store
from routemaster.db.tasks import Lease
from tests.citus_cluster import citus_run
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
}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_writer_waits_for_the_label_before_it_takes_a_transaction_id(
    db_engine: sa.Engine, writer: str
) -> None:
    with db_engine.begin() as conn:
        label = transitions.insert(conn, "m", "raced", {}, state="a", now=NOW)
        assert label is not None
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
        assert tasks.take(completing, task.id, outcome="completed", now=NOW) is not None
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
