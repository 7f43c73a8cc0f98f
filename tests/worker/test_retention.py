"""Retention (SPEC E2): pruning history, deleted and finished labels, as the worker runs it.

The app's clock is a :class:`FakeClock`, so history is written "hours ago"
and pruning is asked to run "now" without waiting; everything else (the
database, the worker's sender, the receiver) is real.
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.app import Settings as AppSettings
from routemaster.db import retention as retention_store
from routemaster.db import subscriptions as subscription_store
from routemaster.db.changes import START, Position, read_changes
from routemaster.db.plumbing.database import create_engine
from routemaster.db.schedules import count_unscheduled
from routemaster.db.subscriptions import SubscriptionSettings
from routemaster.db.transitions import FINISHED_REASON
from routemaster.service import LabelExists
from routemaster.service.retention import prune
from tests.stub_server import StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running

CONFIG = """
subscriptions:
  allow: ['^http://127\\.0\\.0\\.1:']
retention:
  history: 1h
  deleted: 1d
state_machines:
  m:
    retention:
      finished: 3h
    states:
      - gate: start
        triggers: [{metadata: go}]
        exit_condition: metadata.go = true
        next: middle
      - gate: middle
        triggers: [{metadata: end}]
        exit_condition: metadata.end = true
        next: done
      - gate: done
        exit_condition: false
  kept:
    states:
      - gate: only
        exit_condition: false
"""

HOOK = "/events"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.datetime.now(datetime.UTC))


@pytest.fixture
def app(make_app: MakeApp, clock: FakeClock) -> App:
    return make_app(CONFIG, clock=clock, subscription_poll=0.01, subscription_backoff=0.05)


def machine(app: App) -> Any:
    return app.config.get_machine("m")


def history_of(app: App, name: str) -> list[tuple[str | None, str | None, str | None]]:
    return [(e.old_state, e.new_state, e.reason) for e in service.history(app, machine(app), name)]


def all_history(db: sa.Engine) -> list[tuple[str, str | None, str | None]]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT label, old_state, new_state FROM history ORDER BY xact_id, id")
        )
        return [tuple(row) for row in rows]


def three_labels(app: App, clock: FakeClock) -> None:
    """``a`` moved once, ``b`` moved to its end, both two hours ago; ``c`` created now."""
    m = machine(app)
    service.create_label(app, m, "a", {})
    service.create_label(app, m, "b", {})
    service.update_metadata(app, m, "a", {"go": True})
    service.update_metadata(app, m, "b", {"go": True})
    service.update_metadata(app, m, "b", {"end": True})
    clock.advance(hours=2)
    service.create_label(app, m, "c", {})


def test_history_is_pruned_but_each_labels_current_entry_is_kept(
    app: App, clock: FakeClock
) -> None:
    three_labels(app, clock)
    report = prune(app)
    assert report.led and report.rows["history"] == 3
    assert history_of(app, "a") == [("start", "middle", None)]
    assert history_of(app, "b") == [("middle", "done", None)]
    assert history_of(app, "c") == [(None, "start", None)]
    for name in ("a", "b", "c"):  # the current entry is still there for explain and moves
        label = service.get_label(app, machine(app), name)
        assert label.entry_id in {e.id for e in service.history(app, machine(app), name)}
    assert prune(app).rows.get("history", 0) == 0  # kept rows are not read again


def test_a_deleted_label_goes_with_its_history_after_deleted_and_its_name_is_free(
    app: App, clock: FakeClock
) -> None:
    m = machine(app)
    service.create_label(app, m, "gone", {"x": 1})
    service.update_metadata(app, m, "gone", {"go": True})
    service.delete_label(app, m, "gone")
    with pytest.raises(LabelExists):  # deleted, not yet removed: the name is still taken
        service.create_label(app, m, "gone", {})
    assert prune(app, now=clock() + datetime.timedelta(hours=23)).rows.get("labels", 0) == 0

    report = prune(app, now=clock() + datetime.timedelta(days=1, minutes=1))

    assert report.rows["labels"] == 1
    assert history_of(app, "gone") == []
    fresh = service.create_label(app, m, "gone", {"y": 2})
    assert (fresh.state, fresh.metadata, fresh.deleted) == ("start", {"y": 2}, False)
    assert history_of(app, "gone") == [(None, "start", None)]


def test_a_finished_label_is_deleted_after_finished_then_removed_after_deleted(
    app: App, clock: FakeClock, db_engine: sa.Engine
) -> None:
    three_labels(app, clock)  # b has been in "done" (no next) for two hours
    assert prune(app).rows.get("labels_finished", 0) == 0

    clock.advance(hours=1, minutes=1)
    assert prune(app).rows["labels_finished"] == 1

    assert history_of(app, "b")[-1] == ("done", None, FINISHED_REASON)
    assert service.get_label(app, machine(app), "b").deleted
    assert service.get_label(app, machine(app), "a").state == "middle"  # not an end state
    with db_engine.connect() as conn:  # a deleted row is no work for the next-check backfill
        assert count_unscheduled(conn) == 0
    assert prune(app, now=clock() + datetime.timedelta(days=1, minutes=1)).rows["labels"] == 1
    assert [row for row in all_history(db_engine) if row[0] == "b"] == []


def test_pruning_skips_a_label_the_api_holds_and_never_waits_for_it(
    app: App, clock: FakeClock, db_engine: sa.Engine
) -> None:
    three_labels(app, clock)
    clock.advance(hours=1, minutes=1)
    with db_engine.connect() as held:
        held.execute(sa.text("BEGIN"))
        held.execute(sa.text("SELECT 1 FROM labels WHERE name = 'b' FOR UPDATE"))  # a PATCH
        reports: list[Any] = []
        pruning = threading.Thread(target=lambda: reports.append(prune(app)), daemon=True)
        pruning.start()
        wait_until(lambda: bool(reports), timeout=10)  # finished while the row is held
        held.execute(sa.text("ROLLBACK"))
    assert reports[0].rows.get("labels_finished", 0) == 0
    assert service.get_label(app, machine(app), "b").state == "done"
    assert prune(app).rows["labels_finished"] == 1  # taken at the next run


def test_one_leader_at_a_time(app: App, clock: FakeClock) -> None:
    three_labels(app, clock)
    with app.db.begin() as conn:
        assert retention_store.lead(conn)  # another worker's batch in progress
        report = prune(app)
    assert not report.led and not any(report.rows.values())
    assert prune(app).rows["history"] == 3


def test_a_read_from_a_pruned_position_reports_the_gap_then_continues(
    app: App, clock: FakeClock, db_engine: sa.Engine
) -> None:
    three_labels(app, clock)
    prune(app)
    with db_engine.connect() as conn:
        oldest = retention_store.pruned_position(conn, "m")
        page = read_changes(conn, START, machine=None, limit=100, horizon=app.horizon)
        assert page.gap == oldest
        assert all(change.position > oldest for change in page.changes)
        assert [(c.label, c.new_state) for c in page.changes] == [("b", "done"), ("c", "start")]
        assert read_changes(conn, oldest, machine="m", limit=100, horizon=app.horizon).gap is None
        assert read_changes(conn, START, machine="kept", limit=100, horizon=app.horizon).gap is None


def test_a_subscription_behind_the_horizon_moves_on_and_reports_what_it_lost(
    app: App, clock: FakeClock, stub: StubServer
) -> None:
    with app.db.begin() as conn:
        subscription_store.put_subscription(
            conn,
            "s",
            SubscriptionSettings(stub.url(HOOK), None, 100, 0, None),
            after=Position(0, 0),
        )
    three_labels(app, clock)
    prune(app)  # removes a's and b's creation, b's first move: 3 changes never sent
    with app.db.connect() as conn:
        found = subscription_store.get_subscription(conn, "s")
        assert found is not None and found.lost_events == 3
        oldest = retention_store.pruned_position(conn, "m")

    with running(app):
        wait_until(lambda: bool(stub.received(HOOK)), timeout=10)

    sent = [event for request in stub.received(HOOK) for event in request.json()["events"]]
    assert [(e["label"], e["new_state"]) for e in sent] == [("b", "done"), ("c", "start")]
    with app.db.connect() as conn:
        found = subscription_store.get_subscription(conn, "s")
    assert found is not None
    assert found.lost_events == 4  # and a's kept entry, before the horizon, skipped
    assert found.acknowledged > oldest


def test_finished_bulk_jobs_and_the_slots_of_gone_workers_are_forgotten(
    app: App, clock: FakeClock, db_engine: sa.Engine
) -> None:
    with db_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO bulk_jobs (id, state_machine, command, reason, total, finished_at)"
                " VALUES (1, 'm', 'retry', 'old', 2, :old), (2, 'm', 'retry', 'new', 1, :new),"
                " (3, 'm', 'retry', 'running', 1, NULL);"
                " INSERT INTO bulk_items (job_id, name_key, name, shard_key)"
                " SELECT job, routemaster_label_key(name), name, routemaster_shard_key(name)"
                " FROM (VALUES (1, 'a'), (1, 'b'), (2, 'a'), (3, 'a')) AS i(job, name);"
                " INSERT INTO receiver_slots (receiver, worker, in_flight, expires_at) VALUES"
                " ('r', 'gone', 0, :old), ('r', 'alive', 1, :new)"
            ),
            {"old": clock() - datetime.timedelta(days=31), "new": clock()},
        )
    report = prune(app)
    assert (report.rows["bulk_jobs"], report.rows["bulk_items"]) == (1, 2)
    assert report.rows["receiver_slots"] == 1
    with db_engine.connect() as conn:
        jobs = conn.execute(sa.text("SELECT id FROM bulk_jobs ORDER BY id")).scalars().all()
        slots = conn.execute(sa.text("SELECT worker FROM receiver_slots")).scalars().all()
    assert (jobs, slots) == ([2, 3], ["alive"])


NOTIFY = """
  n:
    states:
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: sent
      - gate: sent
        exit_condition: false
"""


def test_a_statement_timeout_in_pruning_leaves_deliveries_running_and_is_retried(
    database_url: str,
    db_engine: sa.Engine,
    make_app: MakeApp,
    clock: FakeClock,
    stub: StubServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    template = make_app(CONFIG + NOTIFY, clock=clock)
    three_labels(template, clock)  # three history entries to prune
    engine = create_engine(database_url, statement_timeout=1)
    settings = AppSettings(poll_interval=0.2, retention_interval=0.5)
    app = App(config=template.config, db=engine, settings=settings, clock=clock)
    blocker = db_engine.connect()
    transaction = blocker.begin()  # every pruning batch records its progress here: it waits
    blocker.execute(sa.text("LOCK TABLE retention_progress IN ACCESS EXCLUSIVE MODE"))
    caplog.set_level(logging.ERROR, logger="routemaster.worker.loop")
    try:
        with running(app):
            wait_until(lambda: "statement timeout while pruning" in caplog.text, "cut off")
            for i in range(5):
                service.create_label(app, app.config.get_machine("n"), f"n{i}", {})
            wait_until(lambda: len(stub.received()) == 5, "deliveries while pruning fails")
            assert "database unavailable" not in caplog.text
            assert len(history_of(app, "a")) == 2  # the failed batch removed nothing
            transaction.rollback()
            wait_until(lambda: len(history_of(app, "a")) == 1, "pruned at a later interval")
    finally:
        if transaction.is_active:
            transaction.rollback()
        blocker.close()
        app.http.close()
        engine.dispose()
