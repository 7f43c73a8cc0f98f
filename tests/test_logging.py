"""Logging plugins: loading ``module:Class`` with kwargs, and the structured PythonLogger."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
import werkzeug.exceptions

from routemaster import service
from routemaster.api.plugins import provide_legacy_names
from routemaster.app import App
from routemaster.config import load_config
from routemaster.config.model import Config, LoggingPlugin
from routemaster.logging import (
    BaseLogger,
    JsonFormatter,
    PluginError,
    PythonLogger,
    format_event,
    load_plugins,
)
from tests.plugin_recorder import Recorder
from tests.stub_server import Reply, running_stub


def _config(*plugins: LoggingPlugin) -> Config:
    return Config(state_machines=(), logging_plugins=plugins)


def test_no_plugins_configured_means_a_python_logger() -> None:
    loggers = load_plugins(_config())
    assert [type(logger) for logger in loggers] == [PythonLogger]


def test_configured_plugins_are_built_with_their_kwargs() -> None:
    loggers = load_plugins(
        _config(
            LoggingPlugin(
                "routemaster.logging:PythonLogger", (("log_level", "DEBUG"), ("json", True))
            ),
            LoggingPlugin("routemaster.logging:BaseLogger"),
        )
    )
    assert [type(logger) for logger in loggers] == [PythonLogger, BaseLogger]
    first = loggers[0]
    assert isinstance(first, PythonLogger)
    assert first.json is True
    assert first.logger.level == logging.DEBUG


@pytest.mark.parametrize(
    ("dotted_path", "kwargs", "message"),
    [
        (
            "routemaster.nowhere:Logger",
            (),
            "cannot load logging plugin 'routemaster.nowhere:Logger'",
        ),
        ("routemaster.logging:Nobody", (), "cannot load logging plugin"),
        ("routemaster.logging.PythonLogger", (), "expected 'package.module:Class'"),
        ("routemaster.logging:format_event", (), "is not a BaseLogger"),
        ("routemaster.logging:PythonLogger", (("colour", "red"),), "colour"),
    ],
)
def test_plugins_that_cannot_be_built_are_reported(
    dotted_path: str, kwargs: tuple[tuple[str, object], ...], message: str
) -> None:
    with pytest.raises(PluginError, match=message):
        load_plugins(_config(LoggingPlugin(dotted_path, kwargs)))


def test_python_logger_writes_key_value_lines(caplog: pytest.LogCaptureFixture) -> None:
    logger = PythonLogger(log_level="INFO")
    with caplog.at_level(logging.INFO, logger="routemaster"):
        logger.transition(state_machine="user", label="a b", old_state=None, new_state="start")
        logger.webhook_called(
            state_machine="user", label="a", url="http://x/h", status=503, duration=0.123456
        )
        logger.feed_fetched(
            state_machine="user", label="a", feed="f", url="http://x/f", status=200, duration=0.1
        )  # DEBUG: below the level
    assert [record.getMessage() for record in caplog.records] == [
        'event=transition state_machine=user label="a b" old_state=null new_state=start '
        "forced=false",
        "event=webhook_called state_machine=user label=a url=http://x/h status=503 duration=0.1235",
    ]


def test_python_logger_writes_json_and_keeps_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = PythonLogger(log_level="DEBUG", json=True)
    error = ValueError("boom")
    with caplog.at_level(logging.DEBUG, logger="routemaster"):
        try:
            raise error
        except ValueError:
            logger.exception("delivery failed")  # as 1.x calls it: while handling the error
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[1] is error
    assert json.loads(record.getMessage()) == {
        "event": "exception",
        "message": "delivery failed",
        "error": "ValueError('boom')",
    }


def test_format_event_quotes_values_that_would_break_the_line() -> None:
    line = format_event("x", {"empty": "", "eq": "a=b", "quote": 'say "hi"', "plain": "ok"})
    assert line == 'event=x empty="" eq="a=b" quote="say \\"hi\\"" plain=ok'


class _Recorder(BaseLogger):
    def __init__(self) -> None:
        self.moves: list[tuple[str, str | None, str | None, bool]] = []

    def transition(
        self,
        *,
        state_machine: str,
        label: str,
        old_state: str | None,
        new_state: str | None,
        forced: bool = False,
    ) -> None:
        self.moves.append((label, old_state, new_state, forced))


def test_plugins_hear_every_transition_the_label_core_makes(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "state_machines:\n"
        "  m:\n"
        "    states:\n"
        "      - gate: start\n"
        "        triggers: [{metadata: go}]\n"
        "        exit_condition: metadata.go\n"
        "        next: end\n"
        "      - gate: end\n"
        "        exit_condition: false\n"
    )
    recorder = _Recorder()
    app = App(config=load_config([path]), db=db_engine, loggers=(recorder,))
    machine = app.config.get_machine("m")
    service.create_label(app, machine, "a", {})
    service.update_metadata(app, machine, "a", {"go": True})
    service.force_move(app, machine, "a", "start")
    service.delete_label(app, machine, "a")
    assert recorder.moves == [
        ("a", "start", "end", False),
        ("a", "end", "start", True),
        ("a", "start", None, False),
    ]


class _FeedRecorder(BaseLogger):
    def __init__(self) -> None:
        self.fetches: list[tuple[str, str, int | None]] = []

    def feed_fetched(
        self,
        *,
        state_machine: str,
        label: str,
        feed: str,
        url: str,
        status: int | None,
        duration: float,
    ) -> None:
        self.fetches.append((feed, url, status))


def test_plugins_hear_every_feed_fetch_with_its_status(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    for stub in running_stub():
        stub.reply_json("/stock/a", {"available": 3})
        stub.script("/stock/b", Reply(503))
        path = tmp_path / "config.yaml"
        path.write_text(
            "state_machines:\n"
            "  m:\n"
            "    feeds:\n"
            f"      - {{name: stock, url: '{stub.url('/stock/<label>')}'}}\n"
            "    states:\n"
            "      - gate: start\n"
            "        triggers: [{metadata: go}]\n"
            "        exit_condition: feeds.stock.available > 0\n"
            "        next: end\n"
            "      - gate: end\n"
            "        exit_condition: false\n"
        )
        recorder = _FeedRecorder()
        app = App(config=load_config([path]), db=db_engine, loggers=(recorder,))
        machine = app.config.get_machine("m")
        for name in ("a", "b"):
            service.create_label(app, machine, name, {})
            service.update_metadata(app, machine, name, {"go": True})
        assert recorder.fetches == [
            ("stock", stub.url("/stock/a"), 200),
            ("stock", stub.url("/stock/b"), 503),
        ]
        assert service.get_label(app, machine, "a").state == "end"
        assert service.get_label(app, machine, "b").state == "start"


def test_plugins_are_built_as_1x_built_them_with_the_config_first() -> None:
    config = _config(LoggingPlugin("tests.plugin_recorder:Recorder", (("name", "metrics"),)))
    [plugin] = load_plugins(config)
    assert isinstance(plugin, Recorder)
    assert plugin.config is config
    assert plugin.name == "metrics"


def test_a_plugin_that_refuses_to_start_is_reported_with_its_reason() -> None:
    with pytest.raises(PluginError, match=r"tests\.plugin_recorder:Refuses.*FOO"):
        load_plugins(_config(LoggingPlugin("tests.plugin_recorder:Refuses")))


def test_names_1x_plugins_import_from_old_werkzeug_are_provided() -> None:
    provide_legacy_names()
    from werkzeug.routing import MethodNotAllowed, NotFound  # type: ignore[attr-defined]

    assert NotFound is werkzeug.exceptions.NotFound
    assert MethodNotAllowed is werkzeug.exceptions.MethodNotAllowed


def test_json_formatter_writes_one_object_per_line_with_the_traceback_inside() -> None:
    logger = PythonLogger(log_level="INFO", json=True)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign, assignment]
    logger.logger.addHandler(handler)
    try:
        logger.transition(state_machine="m", label="a\nb", old_state="x", new_state="y")
        try:
            raise KeyError("k")
        except KeyError:
            logging.getLogger("routemaster.worker").exception("job failed")
    finally:
        logger.logger.removeHandler(handler)
    lines = [JsonFormatter().format(record) for record in records]
    assert all("\n" not in line for line in lines)
    event, failure = (json.loads(line) for line in lines)
    assert event["event"] == "transition" and event["label"] == "a\nb"
    assert event["level"] == "INFO" and event["logger"] == "routemaster"
    assert failure["message"] == "job failed" and failure["logger"] == "routemaster.worker"
    assert "KeyError: 'k'" in failure["traceback"]
