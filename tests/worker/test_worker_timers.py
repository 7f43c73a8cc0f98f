"""Exact timers (SPEC E1): labels waiting in timed gates cost nothing until their time comes.

A :class:`FakeClock` drives the worker round by round, so each test says at
which moment a label must move and checks that it moves then, not before,
and that labels still waiting were never written.
"""

from __future__ import annotations

import datetime
import logging
import threading

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App, Settings
from routemaster.db.plumbing.database import create_engine
from routemaster.service.explanations import explanation_of
from routemaster.worker import Worker
from tests.stub_server import StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running
from tests.worker.test_worker_gates import gate_config, one_round, states

UTC = datetime.UTC
NOON = datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=UTC)


def row_versions(app: App) -> dict[str, str]:
    """Each label's row version (``xmin``): it changes whenever the row is written."""
    with app.db.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, xmin::text AS version FROM labels")).all()
    return {row.name: row.version for row in rows}


def create(app: App, name: str, **metadata: object) -> service.Label:
    return service.create_label(app, app.config.get_machine("m"), name, dict(metadata))


def test_waiting_labels_are_never_written_at_occurrences(make_app: MakeApp) -> None:
    clock = FakeClock(NOON)
    app = make_app(
        gate_config("{interval: 1m}", "12h has passed since history.entered_state"), clock=clock
    )
    for i in range(20):
        create(app, f"l{i}")
    written = row_versions(app)
    worker = Worker(app)
    for _ in range(5):  # five occurrences, none of which could move them
        clock.advance(minutes=1)
        one_round(worker)
    assert row_versions(app) == written, "an occurrence wrote a label that could not move"
    assert set(states(app).values()) == {"start"}
    clock.current = NOON + datetime.timedelta(hours=12, seconds=30)  # 00:01:00, an occurrence
    one_round(worker)
    assert set(states(app).values()) == {"done"}


def test_a_label_moves_at_the_first_occurrence_at_which_its_condition_holds(
    make_app: MakeApp,
) -> None:
    clock = FakeClock(NOON)  # the condition first holds at 00:00:30; occurrences at :00
    app = make_app(
        gate_config("{interval: 1m}", "12h has passed since history.entered_state"), clock=clock
    )
    label = create(app, "x")
    assert label.due_at == datetime.datetime(2024, 7, 2, 0, 1, tzinfo=UTC)
    worker = Worker(app)
    clock.current = datetime.datetime(2024, 7, 2, 0, 0, 59, tzinfo=UTC)
    one_round(worker)
    assert states(app) == {"x": "start"}, "held since 00:00:30, but no occurrence came yet"
    clock.current = datetime.datetime(2024, 7, 2, 0, 1, 0, tzinfo=UTC)
    one_round(worker)
    assert states(app) == {"x": "done"}


def test_a_daily_time_in_a_window_that_the_occurrence_misses_is_rechecked_next_day(
    make_app: MakeApp,
) -> None:
    """``system.time`` between 18:30 and 19:00 never holds at a 19:00 trigger: no spinning."""
    clock = FakeClock(NOON)
    condition = "system.time >= 18:30 and system.time < 18:45"
    app = make_app(gate_config("{time: 19h, timezone: UTC}", condition), clock=clock)
    create(app, "x")
    worker = Worker(app)
    clock.current = datetime.datetime(2024, 7, 1, 19, 0, tzinfo=UTC)
    one_round(worker)
    label = service.get_label(app, app.config.get_machine("m"), "x")
    assert label.state == "start"
    assert label.due_at == datetime.datetime(2024, 7, 2, 19, 0, tzinfo=UTC)


def test_a_timer_trigger_evaluates_at_the_next_check_itself(make_app: MakeApp) -> None:
    clock = FakeClock(NOON)
    send_at = datetime.datetime(2024, 7, 1, 12, 7, 13, tzinfo=UTC)
    app = make_app(gate_config("{event: timer}", "system.now >= metadata.send_at"), clock=clock)
    label = create(app, "x", send_at=send_at.isoformat())
    assert label.due_at == send_at
    worker = Worker(app)
    clock.current = send_at - datetime.timedelta(seconds=1)
    one_round(worker)
    assert states(app) == {"x": "start"}
    clock.current = send_at
    one_round(worker)
    assert states(app) == {"x": "done"}


def test_a_timer_on_a_reply_or_a_deadline(make_app: MakeApp) -> None:
    """F# RouteMaster's timeout manager: a reply expected within two hours."""
    clock = FakeClock(NOON)
    condition = "metadata.reply is defined or 2h has passed since history.entered_state"
    app = make_app(gate_config("{event: timer}", condition), clock=clock)
    machine = app.config.get_machine("m")
    create(app, "replied")
    create(app, "silent")
    written = row_versions(app)
    worker = Worker(app)
    clock.advance(minutes=30)
    one_round(worker)
    assert row_versions(app) == written
    service.update_metadata(app, machine, "replied", {"reply": "yes"})  # no metadata trigger
    one_round(worker)
    assert states(app) == {"replied": "done", "silent": "start"}
    clock.current = NOON + datetime.timedelta(hours=2)
    one_round(worker)
    assert states(app) == {"replied": "done", "silent": "done"}


def test_an_update_reschedules_a_waiting_label(make_app: MakeApp) -> None:
    clock = FakeClock(NOON)
    condition = "metadata.ready and 1h has passed since history.entered_state"
    app = make_app(gate_config("{interval: 1m}", condition), clock=clock)
    machine = app.config.get_machine("m")
    assert create(app, "x").due_at is None, "cannot hold until the metadata changes"
    clock.advance(minutes=10)
    updated = service.update_metadata(app, machine, "x", {"ready": True})
    assert updated.due_at is None  # the label as merged; the schedule is on the row
    stored = service.get_label(app, machine, "x")
    assert stored.due_at == datetime.datetime(2024, 7, 1, 13, 1, tzinfo=UTC)
    explained = explanation_of(app, machine, stored)
    assert explained["next_check_at"] == datetime.datetime(2024, 7, 1, 13, 0, 30, tzinfo=UTC)
    assert "1h has passed since history.entered_state" in explained["next_check_reason"]


def test_rows_written_without_a_next_check_get_one_from_the_worker(make_app: MakeApp) -> None:
    """As after the upgrade, or from a process of an older release during a rolling deploy."""
    clock = FakeClock(NOON)
    app = make_app(
        gate_config("{interval: 1m}", "12h has passed since history.entered_state"), clock=clock
    )
    create(app, "x")
    with app.db.begin() as conn:
        conn.execute(sa.text("UPDATE labels SET due_at = NULL, updated_at = now()"))
    worker = Worker(app)
    one_round(worker)
    label = service.get_label(app, app.config.get_machine("m"), "x")
    assert label.due_at == datetime.datetime(2024, 7, 2, 0, 1, tzinfo=UTC)
    with app.db.connect() as conn:
        unscheduled = conn.execute(
            sa.text("SELECT count(*) FROM labels WHERE scheduled_at IS DISTINCT FROM updated_at")
        ).scalar_one()
    assert unscheduled == 0


def test_a_statement_timeout_in_one_trigger_leaves_deliveries_running(
    database_url: str,
    db_engine: sa.Engine,
    make_app: MakeApp,
    stub: StubServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = (
        gate_config("{interval: 1s}", "false")
        + """
  n:
    states:
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: done
      - gate: done
        exit_condition: false
"""
    )
    template = make_app(config)
    engine = create_engine(database_url, statement_timeout=1)
    app = App(config=template.config, db=engine, settings=Settings(poll_interval=0.2))
    blocker = db_engine.connect()
    transaction = blocker.begin()
    blocker.execute(sa.text("LOCK TABLE trigger_occurrences IN ACCESS EXCLUSIVE MODE"))
    caplog.set_level(logging.ERROR, logger="routemaster.worker.loop")
    released = threading.Event()
    try:
        with running(app):
            wait_until(
                lambda: "statement timeout while clock triggers" in caplog.text,
                "the trigger's statement cut off",
            )
            for i in range(5):
                service.create_label(app, app.config.get_machine("n"), f"n{i}", {})
            wait_until(lambda: len(stub.received()) == 5, "deliveries while the trigger fails")
            assert "database unavailable" not in caplog.text
            transaction.rollback()
            released.set()
    finally:
        if not released.is_set():
            transaction.rollback()
        blocker.close()
        app.http.close()
        engine.dispose()
