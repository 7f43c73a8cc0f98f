"""The worker calls the 1.x plugin hooks around deliveries, feed fetches and its jobs."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from collections.abc import Callable

import pytest

from routemaster import service
from routemaster.app import App
from routemaster.worker import Worker
from routemaster.worker.sweeps import Minutely
from tests.plugin_recorder import Broken, Recorder
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import FakeClock, MakeApp, running

CONFIG = """
state_machines:
  m:
    feeds:
      - {name: stock, url: "{stub}/stock/<label>"}
    states:
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: check
      - gate: check
        triggers: [{event: entry}]
        exit_condition: feeds.stock.available > 0
        next: done
      - gate: done
        exit_condition: false
"""


def _state(app: App, name: str) -> str:
    return service.get_label(app, app.config.get_machine("m"), name).state


def test_deliveries_feeds_and_jobs_are_wrapped_by_the_plugins(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/stock/a", Reply(503), Reply(200, json.dumps({"available": 1}).encode()))
    app = make_app(CONFIG, evaluation_retry_delay=datetime.timedelta(seconds=0.1))
    recorder = Recorder(app.config)
    app.loggers = (Broken(), recorder)
    service.create_label(app, app.config.get_machine("m"), "a", {})
    with running(app):
        wait_until(lambda: _state(app, "a") == "done", "a reaching done")
    feed_url = stub.url("/stock/<label>")
    events = recorder.events
    # One delivery: the webhook call, its response told inside it.
    delivery = events.index(("webhook", "m", "notify"))
    assert events[delivery + 1] == ("webhook_response", "notify", 200)
    # The gate read its feed twice: down (the failure seen inside process_feed), then up.
    assert [e for e in events if e[0].startswith("feed")] == [
        ("feed", "m", "check", feed_url),
        ("feed_response", "check", 503),
        ("feed failed", "FeedUnavailable"),
        ("feed", "m", "check", feed_url),
        ("feed_response", "check", 200),
    ]
    # 1.x's jobs: the action state's minutely sweep; an entry-triggered gate has none.
    assert {e for e in events if e[0] == "cron"} == {("cron", "m", "notify", "process_action")}
    assert recorder.named("exception") == []


def test_an_unexpected_error_in_a_job_reaches_every_plugin(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG)
    recorder = Recorder(app.config)
    app.loggers = (recorder, Broken())  # Broken swallows the error: the others still see it

    def explode(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    # A bug in the http layer: the failure passes through process_webhook, and is reported.
    app.http.get_adapter = explode  # type: ignore[method-assign, assignment]
    service.create_label(app, app.config.get_machine("m"), "a", {})
    with running(app):
        wait_until(lambda: bool(recorder.named("exception")), "the error reported")
    assert ("webhook failed", "ZeroDivisionError") in recorder.events
    assert recorder.named("exception")[0] == (
        "exception",
        "worker job for m/a failed",
        "ZeroDivisionError",
    )
    assert _state(app, "a") == "notify"


SCHEDULED = """
state_machines:
  m:
    states:
      - gate: start
        triggers: [{metadata: a}, {metadata: b}, {event: entry}]
        exit_condition: false
        next: notify
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: hourly
      - gate: hourly
        triggers: [{interval: 1h}]
        exit_condition: false
        next: daily
      - gate: daily
        triggers: [{time: 18h30m, timezone: UTC}]
        exit_condition: false
        next: start
"""


def test_process_cron_runs_on_1x_schedule(make_app: MakeApp) -> None:
    """Each action state and metadata trigger once a minute; clock triggers as they fire."""
    clock = FakeClock(datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=datetime.UTC))
    app = make_app(SCHEDULED, clock=clock)
    recorder = Recorder(app.config)
    app.loggers = (recorder,)
    worker = Worker(app)

    def jobs_after(step: Callable[[], object]) -> Counter[tuple[str, str]]:
        recorder.events.clear()
        step()
        worker.work_once()
        return Counter((state, fn) for kind, _, state, fn in recorder.named("cron"))

    minutely = Counter({("notify", "process_action"): 1, ("start", "process_gate"): 2})
    # At start: the minutely jobs, and the interval's occurrence just past (12:00).
    hourly = Counter({("hourly", "process_gate"): 1})
    assert jobs_after(worker.triggers.fire) == minutely + hourly
    assert jobs_after(lambda: clock.advance(seconds=20)) == Counter()  # the same minute
    assert jobs_after(lambda: clock.advance(seconds=20)) == minutely  # 12:01:10
    clock.current = datetime.datetime(2024, 7, 1, 13, 0, 5, tzinfo=datetime.UTC)
    assert jobs_after(worker.triggers.fire) == minutely + hourly
    clock.current = datetime.datetime(2024, 7, 1, 18, 30, 1, tzinfo=datetime.UTC)
    daily = Counter({("daily", "process_gate"): 1})
    assert jobs_after(worker.triggers.fire) == minutely + hourly + daily  # 18:00 and 18:30


def test_process_cron_wraps_the_sweep_of_its_state(make_app: MakeApp, stub: StubServer) -> None:
    """An action's minutely job claims its due deliveries; a failing sweep is seen by plugins."""
    app = make_app(SCHEDULED)
    recorder = Recorder(app.config)
    app.loggers = (recorder,)
    machine = app.config.get_machine("m")
    service.create_label(app, machine, "x", {})
    service.force_move(app, machine, "x", "notify")  # its delivery is due
    worker = Worker(app)
    worker.minutely.run_pending()  # the sweeps alone: notify's claims x
    wait_until(lambda: stub.received("/hook/x"), "x delivered by the action's sweep")
    assert ("cron", "m", "notify", "process_action") in recorder.named("cron")

    def broken(sweep: object) -> None:
        raise ZeroDivisionError("a bug")

    failing = Minutely(app, broken)
    with pytest.raises(ZeroDivisionError):
        failing.run_pending()
    assert ("cron failed", "ZeroDivisionError") in recorder.events
