"""Logging plugins: 1.x's ``plugins.logging`` config and hooks, and our structured logger.

A config names plugins as ``module:Class`` with keyword arguments::

    plugins:
      logging:
        - class: routemaster.logging:PythonLogger
          kwargs: {log_level: INFO}

Each is built as in 1.x, ``Class(config, **kwargs)``, and must subclass
:class:`BaseLogger`. The API and the worker call the hooks through
:class:`routemaster.hooks.Hooks`: 1.x's (``init_flask``, ``process_request_*``,
``process_webhook``/``webhook_response``, ``process_feed``/``feed_response``,
``process_cron``, ``exception``) so plugins written for 1.x (Sentry,
Prometheus, StatsD) work unchanged, and ours (``transition``,
``webhook_called``, ``feed_fetched``). With no plugin configured, a
:class:`PythonLogger` at ``INFO`` is used.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import logging
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from routemaster.config.model import Config


class BaseLogger:
    """Every hook a plugin may override; each does nothing here.

    ``state_machine`` and ``state`` arguments of the 1.x hooks are the
    config's objects (their ``name`` is what plugins read); ``response`` is
    the ``requests.Response`` received. The ``process_*`` hooks are context
    managers around the work: they must yield, and must let the work's
    exceptions propagate (they may look at them on the way).
    """

    def __init__(self, config: Config | None = None, *args: Any, **kwargs: Any) -> None:
        self.config = config

    def init_flask(self, flask_app: Any) -> None:
        """Called in each API process once its Flask app is built."""

    def process_request_started(self, environ: dict[str, Any]) -> None:
        """An API request came in (the WSGI environ)."""

    def process_request_finished(
        self, environ: dict[str, Any], *, status: str, headers: Any, exc_info: Any
    ) -> None:
        """The request's response was sent; ``status`` is its code as text (``"200"``)."""

    @contextlib.contextmanager
    def process_cron(self, state_machine: Any, state: Any, fn_name: str) -> Iterator[None]:
        """Around one piece of worker work on ``state`` (``process_action``/``process_gate``)."""
        yield

    @contextlib.contextmanager
    def process_webhook(self, state_machine: Any, state: Any) -> Iterator[None]:
        """Around one webhook call of action ``state``."""
        yield

    def webhook_response(self, state_machine: Any, state: Any, response: Any) -> None:
        """A webhook answered (not called when no answer came)."""

    @contextlib.contextmanager
    def process_feed(self, state_machine: Any, state: Any, feed_url: str) -> Iterator[None]:
        """Around one feed fetch (``feed_url`` as configured); a failed fetch raises inside."""
        yield

    def feed_response(self, state_machine: Any, state: Any, feed_url: str, response: Any) -> None:
        """A feed answered (not called when no answer came)."""

    def debug(self, message: str, *args: Any, **kwargs: Any) -> None:
        """1.x's logger API, kept so plugins may call it on themselves."""

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        """See :meth:`debug`."""

    def warning(self, message: str, *args: Any, **kwargs: Any) -> None:
        """See :meth:`debug`."""

    def error(self, message: str, *args: Any, **kwargs: Any) -> None:
        """See :meth:`debug`."""

    def critical(self, message: str, *args: Any, **kwargs: Any) -> None:
        """See :meth:`debug`."""

    def exception(self, message: str, *args: Any, **kwargs: Any) -> None:
        """Something failed unexpectedly: called while it is handled (``sys.exc_info()``)."""

    def transition(
        self,
        *,
        state_machine: str,
        label: str,
        old_state: str | None,
        new_state: str | None,
        forced: bool = False,
    ) -> None:
        """A label moved (``new_state`` is ``None`` when it was deleted)."""

    def webhook_called(
        self,
        *,
        state_machine: str,
        label: str,
        url: str,
        status: int | None,
        duration: float,
    ) -> None:
        """An action's webhook answered ``status`` (``None``: no answer) after ``duration`` s."""

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
        """A feed answered with ``status`` (``None``: no answer) after ``duration`` seconds."""

    def task_event(self, *, state_machine: str, state: str, label: str, event: str) -> None:
        """A pull task was ``claimed``, ``completed``, ``failed``, ``released`` or ``expired``."""


class PythonLogger(BaseLogger):
    """Events as one line each on the stdlib logger ``routemaster``.

    Lines are ``event=transition state_machine=user label=... `` key=value
    pairs; with ``json: true`` every log line of the process is one JSON
    object (see :class:`JsonFormatter`, installed by the command line).
    """

    def __init__(
        self,
        config: Config | None = None,
        *args: Any,
        log_level: str | int = "INFO",
        json: bool = False,
    ) -> None:
        super().__init__(config, *args)
        self.logger = logging.getLogger("routemaster")
        self.logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
        self.json = json

    def init_flask(self, flask_app: Any) -> None:
        flask_app.logger.setLevel(self.logger.level)

    # The events' fields are BaseLogger's (the plugin API's, declared there once); each line
    # shows every field, its default included.

    def transition(self, **event: Any) -> None:
        self._emit_event(logging.INFO, BaseLogger.transition, event)

    def webhook_called(self, **event: Any) -> None:
        status = event["status"]
        # Successes are the bulk and their transitions are logged anyway: DEBUG.
        level = logging.DEBUG if status is not None and 200 <= status < 300 else logging.WARNING
        self._emit_event(level, BaseLogger.webhook_called, event)

    def feed_fetched(self, **event: Any) -> None:
        self._emit_event(logging.DEBUG, BaseLogger.feed_fetched, event)

    def _emit_event(self, level: int, hook: Callable[..., None], event: dict[str, Any]) -> None:
        if not self.logger.isEnabledFor(level):
            return
        fields_of = _fields_of(hook)
        unknown = event.keys() - {name for name, _ in fields_of}
        if unknown:
            raise TypeError(f"{hook.__name__}() got unexpected fields {sorted(unknown)}")
        fields = {}
        for name, default in fields_of:
            if name in event:
                fields[name] = event[name]
            elif default is inspect.Parameter.empty:
                raise TypeError(f"{hook.__name__}() missing the field {name!r}")
            else:
                fields[name] = default
        if "duration" in fields:
            fields["duration"] = round(fields["duration"], 4)
        self._emit(level, hook.__name__, **fields)

    def exception(self, message: str, *args: Any, **kwargs: Any) -> None:
        error = sys.exc_info()[1]
        self._emit(
            logging.ERROR,
            "exception",
            message=message,
            error=None if error is None else repr(error),
            exc_info=error,
        )

    def _emit(
        self, level: int, event: str, exc_info: BaseException | None = None, **fields: Any
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return
        self.logger.log(
            level,
            format_event(event, fields, as_json=self.json),
            exc_info=exc_info,
            extra={"routemaster_event": {"event": event, **fields}},
        )


@functools.cache
def _fields_of(hook: Callable[..., None]) -> tuple[tuple[str, Any], ...]:
    """A hook's fields in order, each with its default (``inspect.Parameter.empty`` when it has
    none), read once per hook: reading a signature costs more than the rest of an event."""
    parameters = list(inspect.signature(hook).parameters.values())[1:]  # after self
    return tuple((parameter.name, parameter.default) for parameter in parameters)


# What makes a value quoted: whitespace (as str.isspace sees it), a quote or an equals sign.
_NEEDS_QUOTES = re.compile(r'[\s"=]')


def format_event(event: str, fields: dict[str, Any], *, as_json: bool = False) -> str:
    """One event as a single line: ``key=value`` pairs (values quoted when needed) or JSON."""
    if as_json:
        return json.dumps({"event": event, **fields}, default=str, sort_keys=False)
    parts = [f"event={event}"]
    for key, value in fields.items():
        if value is None:
            text = "null"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        if not text or _NEEDS_QUOTES.search(text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """Each record as one JSON object on one line: time, level, logger, process, message.

    An event from :class:`PythonLogger` puts its fields at the top level; a
    traceback is one string field, so a line is always exactly one object.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
        }
        event = getattr(record, "routemaster_event", None)
        if isinstance(event, dict):
            line.update(event)
        else:
            line["message"] = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            line["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(line, default=str)


def wants_json(loggers: tuple[BaseLogger, ...] | list[BaseLogger]) -> bool:
    """Whether a configured :class:`PythonLogger` asked for JSON lines."""
    return any(isinstance(logger, PythonLogger) and logger.json for logger in loggers)


class PluginError(Exception):
    """A configured logging plugin could not be loaded."""


def load_plugins(config: Config) -> list[BaseLogger]:
    """Build the configured logging plugins as 1.x did (a :class:`PythonLogger` if none are).

    The command line first provides the old Werkzeug names 1.x plugins import
    (:func:`routemaster.api.plugins.provide_legacy_names`).
    """
    if not config.logging_plugins:
        return [PythonLogger(config)]
    loggers: list[BaseLogger] = []
    for plugin in config.logging_plugins:
        module_name, _, class_name = plugin.dotted_path.partition(":")
        if not module_name or not class_name:
            raise PluginError(f"{plugin.dotted_path!r}: expected 'package.module:Class'")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as error:
            raise PluginError(
                f"cannot load logging plugin {plugin.dotted_path!r}: {error}"
            ) from error
        if not (isinstance(cls, type) and issubclass(cls, BaseLogger)):
            raise PluginError(f"logging plugin {plugin.dotted_path!r} is not a BaseLogger")
        try:
            loggers.append(cls(config, **dict(plugin.kwargs)))
        except Exception as error:  # a plugin's own check (a missing variable, say) included
            raise PluginError(f"logging plugin {plugin.dotted_path!r}: {error}") from error
    return loggers
