"""Gates evaluated by the worker: clock triggers, retried evaluations, feeds.

Clock-driven tests inject a :class:`FakeClock` and drive one worker round at
a time (``triggers.fire``, ``work_once``) so daily times and zones are tested at exact
moments.
"""

from __future__ import annotations

import datetime

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.worker import Worker
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running

UTC = datetime.UTC


def gate_config(trigger: str, condition: str = "true", next_: str = "done") -> str:
    return f"""
state_machines:
  m:
    feeds:
      - name: f
        url: "{{stub}}/feed/<label>"
    states:
      - gate: start
        triggers: [{trigger}]
        exit_condition: {condition}
        next: {next_}
      - gate: done
        exit_condition: false
        next: b  # only so that b is reachable in every variant
      - gate: b
        exit_condition: false
"""


def create(app: App, *names: str, **metadata: object) -> None:
    machine = app.config.get_machine("m")
    for name in names:
        service.create_label(app, machine, name, dict(metadata))


def states(app: App) -> dict[str, str]:
    with app.db.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, state FROM labels")).all()
    return {row.name: row.state for row in rows}


def one_round(worker: Worker) -> None:
    """Fire triggers, then work until nothing is due (waiting for pooled feed evaluations)."""
    worker.triggers.fire()
    while worker.work_once():
        pass
    wait_until(lambda: not worker.in_flight, "the slots' evaluations done")
    while worker.work_once():  # what the slots finished
        pass


def test_interval_trigger_evaluates_every_label_in_the_gate(make_app: MakeApp) -> None:
    app = make_app(gate_config("{interval: 1s}", "metadata.ready = true"), batch_size=7)
    create(app, *(f"l{i}" for i in range(40)))
    machine = app.config.get_machine("m")
    for i in range(0, 40, 2):
        service.update_metadata(app, machine, f"l{i}", {"ready": True})  # no metadata trigger
    assert set(states(app).values()) == {"start"}
    with running(app):
        wait_until(
            lambda: sum(state == "done" for state in states(app).values()) >= 20,
            lambda: states(app),
        )
    assert states(app) == {f"l{i}": "done" if i % 2 == 0 else "start" for i in range(40)}


def test_interval_occurrence_is_handled_once_across_workers(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=UTC))
    config = gate_config("{interval: 1m}", "metadata.ready = true")
    apps = [make_app(config, clock=clock) for _ in range(3)]
    create(apps[0], "x")
    workers = [Worker(app) for app in apps]
    caplog.set_level("INFO", logger="routemaster.worker.clock_triggers")
    for worker in workers:
        worker.triggers.fire()
    clock.advance(seconds=20)
    for worker in workers:
        worker.triggers.fire()
    clock.advance(seconds=20)  # 12:01:10: the next occurrence
    for worker in workers:
        worker.triggers.fire()
    fired = [r.getMessage() for r in caplog.records if "fired" in r.getMessage()]
    assert len(fired) == 2
    assert "2024-07-01T12:00:00+00:00" in fired[0]
    assert "2024-07-01T12:01:00+00:00" in fired[1]


def test_daily_time_in_a_named_zone(make_app: MakeApp) -> None:
    clock = FakeClock(datetime.datetime(2024, 7, 1, 12, 59, 59, tzinfo=UTC))  # 08:59:59 EDT
    app = make_app(gate_config("{time: 9h, timezone: America/New_York}"), clock=clock)
    create(app, "x", "y")
    worker = Worker(app)
    one_round(worker)
    assert states(app) == {"x": "start", "y": "start"}
    clock.advance(seconds=2)
    one_round(worker)
    assert states(app) == {"x": "done", "y": "done"}
    create(app, "late")
    clock.advance(minutes=5)
    one_round(worker)
    one_round(Worker(make_app(gate_config("{time: 9h, timezone: America/New_York}"), clock=clock)))
    assert states(app)["late"] == "start", "the 09:00 occurrence was handled once, not again"


def test_daily_time_in_system_time(make_app: MakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    clock = FakeClock(datetime.datetime(2024, 7, 1, 8, 59, 59, tzinfo=UTC))  # 17:59:59 JST
    app = make_app(gate_config("{time: 18h}"), clock=clock)
    create(app, "x")
    worker = Worker(app)
    one_round(worker)
    assert states(app) == {"x": "start"}
    clock.advance(seconds=2)
    one_round(worker)
    assert states(app) == {"x": "done"}


def test_daily_time_in_each_labels_zone(make_app: MakeApp) -> None:
    """Each label falls due at the daily time in its own zone; a bad or missing zone never."""
    clock = FakeClock(datetime.datetime(2024, 7, 1, 8, 0, 30, tzinfo=UTC))  # 09:00:30 in London
    app = make_app(gate_config("{time: 9h, timezone: metadata.user.tz}"), clock=clock)
    machine = app.config.get_machine("m")
    service.create_label(app, machine, "london", {"user": {"tz": "Europe/London"}})
    service.create_label(app, machine, "tokyo", {"user": {"tz": "Asia/Tokyo"}})
    service.create_label(app, machine, "bad", {"user": {"tz": "Not/AZone"}})
    service.create_label(app, machine, "none", {})
    worker = Worker(app)
    clock.current = datetime.datetime(2024, 7, 1, 23, 59, 59, tzinfo=UTC)  # 08:59:59 in Tokyo
    one_round(worker)
    assert set(states(app).values()) == {"start"}, "09:00 in London was before they entered"
    clock.current = datetime.datetime(2024, 7, 2, 0, 0, 0, tzinfo=UTC)  # 09:00 in Tokyo
    one_round(worker)
    assert states(app) == {"london": "start", "tokyo": "done", "bad": "start", "none": "start"}
    clock.current = datetime.datetime(2024, 7, 2, 8, 0, 0, tzinfo=UTC)  # 09:00 in London
    one_round(worker)
    assert states(app) == {"london": "done", "tokyo": "done", "bad": "start", "none": "start"}


def test_failed_in_request_evaluation_is_retried_by_the_worker(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/feed/x", Reply(503), Reply(200, b'{"ok": true}'))
    clock = FakeClock(datetime.datetime.now(UTC))
    app = make_app(gate_config("{metadata: go}", "feeds.f.ok = true"), clock=clock)
    machine = app.config.get_machine("m")
    create(app, "x")
    label = service.update_metadata(app, machine, "x", {"go": 1})
    assert label.state == "start"  # the update itself succeeded
    assert label.last_error is not None and "503" in label.last_error
    worker = Worker(app)
    one_round(worker)
    assert len(stub.received()) == 1, "not retried before its retry time"
    clock.advance(minutes=5)
    one_round(worker)
    label = service.get_label(app, machine, "x")
    assert (label.state, label.due_at, label.last_error) == ("done", None, None)
    assert len(stub.received()) == 2


def test_feeds_in_condition_and_context_transition_fetched_once(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.reply_json("/feed/x", {"ready": True, "variant": "b"})
    stub.reply_json("/feed/y", {"ready": False, "variant": "b"})
    next_ = (
        "{type: context, path: feeds.f.variant, default: done,"
        " destinations: [{value: b, state: b}]}"
    )
    clock = FakeClock(datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=UTC))
    app = make_app(gate_config("{interval: 1h}", "feeds.f.ready = true", next_), clock=clock)
    create(app, "x", "y")
    worker = Worker(app)
    one_round(worker)
    assert stub.received() == [], "feeds are fetched only when an evaluation reads them"
    clock.current = datetime.datetime(2024, 7, 1, 13, 0, 0, tzinfo=UTC)  # the next occurrence
    one_round(worker)
    assert states(app) == {"x": "b", "y": "start"}
    assert len(stub.received("/feed/x")) == 1
    assert len(stub.received("/feed/y")) == 1
    waiting = service.get_label(app, app.config.get_machine("m"), "y")
    assert waiting.due_at == datetime.datetime(2024, 7, 1, 14, 0, tzinfo=UTC), (
        "a feed may change at any moment: evaluated again at the next occurrence"
    )


def test_a_failed_feed_leaves_the_label_in_its_gate(
    make_app: MakeApp, stub: StubServer, caplog: pytest.LogCaptureFixture
) -> None:
    stub.script("/feed/x", Reply(502))
    clock = FakeClock(datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=UTC))
    app = make_app(gate_config("{interval: 1h}", "feeds.f.ready = true"), clock=clock)
    create(app, "x")
    clock.current = datetime.datetime(2024, 7, 1, 13, 0, 0, tzinfo=UTC)  # the next occurrence
    one_round(Worker(app))
    label = service.get_label(app, app.config.get_machine("m"), "x")
    assert label.state == "start"
    assert label.due_at is not None and label.due_at > clock.current
    assert label.last_error is not None and "502" in label.last_error
    assert stub.url("/feed/x") in caplog.text and "502" in caplog.text


def test_entry_trigger_evaluates_as_an_action_completes(
    make_app: MakeApp, stub: StubServer
) -> None:
    config = """
state_machines:
  m:
    states:
      - action: notify
        webhook: "{stub}/hook"
        next: check
      - gate: check
        triggers: [{event: entry}]
        exit_condition: metadata.skip = true
        next: done
      - gate: done
        exit_condition: false
"""
    app = make_app(config)
    machine = app.config.get_machine("m")
    service.create_label(app, machine, "x", {"skip": True})
    service.create_label(app, machine, "y", {"skip": False})
    with running(app):
        wait_until(lambda: states(app) == {"x": "done", "y": "check"}, lambda: states(app))


def test_metadata_sent_while_paused_is_evaluated_on_resume(make_app: MakeApp) -> None:
    app = make_app(gate_config("{metadata: ready}", "metadata.ready = true"))
    machine = app.config.get_machine("m")
    create(app, "p")
    service.set_label_paused(app, machine, "p", True)
    assert service.update_metadata(app, machine, "p", {"ready": True}).state == "start"
    worker = Worker(app)
    one_round(worker)
    assert states(app) == {"p": "start"}  # paused: nothing moves
    service.set_label_paused(app, machine, "p", False)
    one_round(worker)
    assert states(app) == {"p": "done"}


def test_a_clock_trigger_that_fired_while_paused_is_owed_on_resume(make_app: MakeApp) -> None:
    clock = FakeClock(datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=UTC))
    app = make_app(gate_config("{interval: 1h}", "metadata.ready = true"), clock=clock)
    machine = app.config.get_machine("m")
    create(app, "p", ready=True)  # no entry trigger: it waits for the interval
    service.set_label_paused(app, machine, "p", True)
    worker = Worker(app)
    clock.current = datetime.datetime(2024, 7, 1, 13, 0, 0, tzinfo=UTC)  # the next occurrence
    one_round(worker)
    assert states(app) == {"p": "start"}
    service.set_label_paused(app, machine, "p", False)
    one_round(worker)
    assert states(app) == {"p": "done"}
