"""The worker calls the 1.x plugin hooks around deliveries, feed fetches and its jobs."""

from __future__ import annotations

import datetime
import json

from routemaster import labels
from routemaster.app import App
from tests.plugin_recorder import Broken, Recorder
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running

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
    return labels.get_label(app, app.config.get_machine("m"), name).state


def test_deliveries_feeds_and_jobs_are_wrapped_by_the_plugins(
    make_app: MakeApp, stub: StubServer
) -> None:
    stub.script("/stock/a", Reply(503), Reply(200, json.dumps({"available": 1}).encode()))
    app = make_app(CONFIG, evaluation_retry_delay=datetime.timedelta(seconds=0.1))
    recorder = Recorder(app.config)
    app.loggers = (Broken(), recorder)
    labels.create_label(app, app.config.get_machine("m"), "a", {})
    with running(app):
        wait_until(lambda: _state(app, "a") == "done", "a reaching done")
    feed_url = stub.url("/stock/<label>")
    events = recorder.events
    # One delivery: the webhook call inside the job, its response told in between.
    delivery = events.index(("cron", "m", "notify", "process_action"))
    assert events[delivery + 1 : delivery + 3] == [
        ("webhook", "m", "notify"),
        ("webhook_response", "notify", 200),
    ]
    # The gate read its feed twice: down (the failure seen inside process_feed), then up.
    assert [e for e in events if e[0].startswith("feed")] == [
        ("feed", "m", "check", feed_url),
        ("feed_response", "check", 503),
        ("feed failed", "FeedUnavailable"),
        ("feed", "m", "check", feed_url),
        ("feed_response", "check", 200),
    ]
    assert ("cron", "m", "check", "process_gate") in events
    assert recorder.named("exception") == []


def test_an_unexpected_error_in_a_job_reaches_every_plugin(
    make_app: MakeApp, stub: StubServer
) -> None:
    app = make_app(CONFIG)
    recorder = Recorder(app.config)
    app.loggers = (recorder, Broken())  # Broken swallows the error: the others still see it

    def explode(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    # A bug in the http layer: the failure passes through process_webhook and process_cron.
    app.http.get_adapter = explode  # type: ignore[method-assign, assignment]
    labels.create_label(app, app.config.get_machine("m"), "a", {})
    with running(app):
        wait_until(lambda: bool(recorder.named("exception")), "the error reported")
    assert ("webhook failed", "ZeroDivisionError") in recorder.events
    assert ("cron failed", "ZeroDivisionError") in recorder.events
    assert recorder.named("exception")[0] == (
        "exception",
        "worker job for m/a failed",
        "ZeroDivisionError",
    )
    assert _state(app, "a") == "notify"
