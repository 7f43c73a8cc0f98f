"""Logging plugins: the reference's ``plugins.logging`` config, and our structured logger.

A config names plugins as ``module:Class`` with keyword arguments::

    plugins:
      logging:
        - class: routemaster.logging:PythonLogger
          kwargs: {log_level: INFO}

The API and the worker call the hooks of every loaded plugin at the moments
that matter (a transition, a webhook call, a feed fetch, an unexpected
exception), so a deployment can send those events wherever it likes by
writing a :class:`BaseLogger` subclass. With no plugin configured, a
:class:`PythonLogger` at ``INFO`` is used.
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any, Protocol

from routemaster.config.model import Config


class FlaskLike(Protocol):
    """The one thing a logger needs from the Flask app, so this module never imports Flask."""

    @property
    def logger(self) -> logging.Logger: ...


class BaseLogger:
    """Hooks called by the API and the worker; every one does nothing unless overridden."""

    def init_flask(self, flask_app: FlaskLike) -> None:
        """Called once when the API's Flask app is built."""

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
        state: str | None = None,
    ) -> None:
        """Action ``state``'s webhook answered ``status`` (``None``: none) after ``duration`` s."""

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

    def exception(self, message: str, error: BaseException, **fields: Any) -> None:
        """Something failed unexpectedly; ``fields`` say where (machine, label, ...)."""


class PythonLogger(BaseLogger):
    """Events as one line each on the stdlib logger ``routemaster``.

    Lines are ``event=transition state_machine=user label=... `` key=value
    pairs, or JSON objects with ``json: true``.
    """

    def __init__(self, log_level: str | int = "INFO", json: bool = False) -> None:
        self.logger = logging.getLogger("routemaster")
        self.logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
        self.json = json

    def init_flask(self, flask_app: FlaskLike) -> None:
        flask_app.logger.setLevel(self.logger.level)

    def transition(
        self,
        *,
        state_machine: str,
        label: str,
        old_state: str | None,
        new_state: str | None,
        forced: bool = False,
    ) -> None:
        self._emit(
            logging.INFO,
            "transition",
            state_machine=state_machine,
            label=label,
            old_state=old_state,
            new_state=new_state,
            forced=forced,
        )

    def webhook_called(
        self,
        *,
        state_machine: str,
        label: str,
        url: str,
        status: int | None,
        duration: float,
        state: str | None = None,
    ) -> None:
        # Successes are the bulk and their transitions are logged anyway: DEBUG.
        level = logging.DEBUG if status is not None and 200 <= status < 300 else logging.WARNING
        self._emit(
            level,
            "webhook_called",
            state_machine=state_machine,
            label=label,
            state=state,
            url=url,
            status=status,
            duration=round(duration, 4),
        )

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
        self._emit(
            logging.DEBUG,
            "feed_fetched",
            state_machine=state_machine,
            label=label,
            feed=feed,
            url=url,
            status=status,
            duration=round(duration, 4),
        )

    def exception(self, message: str, error: BaseException, **fields: Any) -> None:
        self._emit(
            logging.ERROR, "exception", message=message, error=repr(error), **fields, exc_info=error
        )

    def _emit(
        self, level: int, event: str, exc_info: BaseException | None = None, **fields: Any
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return
        self.logger.log(level, format_event(event, fields, as_json=self.json), exc_info=exc_info)


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
        if not text or any(c.isspace() or c in '"=' for c in text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class PluginError(Exception):
    """A configured logging plugin could not be loaded."""


def load_plugins(config: Config) -> list[BaseLogger]:
    """Instantiate the configured logging plugins (a :class:`PythonLogger` if none are)."""
    if not config.logging_plugins:
        return [PythonLogger()]
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
            loggers.append(cls(**dict(plugin.kwargs)))
        except TypeError as error:
            raise PluginError(f"logging plugin {plugin.dotted_path!r}: {error}") from error
    return loggers
