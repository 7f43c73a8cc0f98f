"""Calling the logging plugins' hooks: the one object the API, the http layer and the worker use.

Plugins are other people's code: a hook that raises is logged here and never
breaks the request or the job it observes. The ``process_*`` context
managers of every plugin are entered together around the work, so each sees
the work's exceptions (and must let them through, as 1.x required).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol

from routemaster.config.model import State, StateMachine
from routemaster.logging import BaseLogger

logger = logging.getLogger(__name__)

P = ParamSpec("P")


class Answer(Protocol):
    """What the http layer received (:class:`routemaster.http.client.Answer`)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def body(self) -> bytes: ...


@dataclass(frozen=True)
class Response:
    """What 1.x gave plugins as ``response`` (a ``requests.Response``): the parts they read."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes  # at most the configured response-size cap

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


ResponseLogger = Callable[[Answer], None]
"""Told of each answer received inside a ``process_webhook``/``process_feed`` hook."""


def overrides(plugin: BaseLogger, hook: str) -> bool:
    """Whether ``plugin``'s class implements ``hook`` itself rather than inheriting the no-op."""
    return getattr(type(plugin), hook, None) is not getattr(BaseLogger, hook)


def _tells(
    hook: Callable[Concatenate[BaseLogger, P], None],
) -> Callable[Concatenate[Hooks, P], None]:
    """A method of :class:`Hooks` telling every plugin of an event, with ``hook``'s signature
    (the plugin API's, :class:`~routemaster.logging.BaseLogger`'s: written there alone)."""
    name = hook.__name__

    def tell(self: Hooks, /, *args: P.args, **kwargs: P.kwargs) -> None:
        self._tell(name, *args, **kwargs)

    tell.__name__ = name
    tell.__doc__ = hook.__doc__
    return tell


class Hooks:
    def __init__(self, plugins: Sequence[BaseLogger]) -> None:
        self.plugins = tuple(plugins)
        request_hooks = ("process_request_started", "process_request_finished")
        self.request_plugins = tuple(
            plugin
            for plugin in self.plugins
            if any(overrides(plugin, hook) for hook in request_hooks)
        )

    @property
    def observe_requests(self) -> bool:
        """Whether any plugin wants the per-request hooks (else the API skips them entirely)."""
        return bool(self.request_plugins)

    def init_flask(self, flask_app: Any) -> None:
        for plugin in self.plugins:
            self._call(plugin, "init_flask", flask_app)

    def request_started(self, environ: dict[str, Any]) -> None:
        for plugin in self.request_plugins:
            self._call(plugin, "process_request_started", environ)

    def request_finished(
        self, environ: dict[str, Any], *, status: str, headers: Any, exc_info: Any
    ) -> None:
        for plugin in self.request_plugins:
            self._call(
                plugin,
                "process_request_finished",
                environ,
                status=status,
                headers=headers,
                exc_info=exc_info,
            )

    @contextlib.contextmanager
    def cron(self, machine: StateMachine, state: State, fn_name: str) -> Iterator[None]:
        """Around one of 1.x's jobs on ``state``: ``process_cron`` (routemaster.worker.sweeps)."""
        with self._around("process_cron", machine, state, fn_name):
            yield

    @contextlib.contextmanager
    def webhook(self, machine: StateMachine, state: State) -> Iterator[ResponseLogger]:
        """Around one webhook call; yields what to tell of the response received."""
        with self._around("process_webhook", machine, state):
            yield lambda answer: self._tell("webhook_response", machine, state, _response(answer))

    @contextlib.contextmanager
    def feed(self, machine: StateMachine, state: State, feed_url: str) -> Iterator[ResponseLogger]:
        """Around one feed fetch (``feed_url`` as configured, before substitution)."""
        with self._around("process_feed", machine, state, feed_url):
            yield lambda answer: self._tell(
                "feed_response", machine, state, feed_url, _response(answer)
            )

    def exception(self, message: str) -> None:
        """Tell every plugin of an unexpected error; call it while the error is being handled."""
        self._tell("exception", message)

    # The events: each hook's signature is BaseLogger's, declared there once.
    transition = _tells(BaseLogger.transition)
    webhook_called = _tells(BaseLogger.webhook_called)
    feed_fetched = _tells(BaseLogger.feed_fetched)
    task_event = _tells(BaseLogger.task_event)

    def _tell(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for plugin in self.plugins:
            self._call(plugin, hook, *args, **kwargs)

    @staticmethod
    def _call(plugin: BaseLogger, hook: str, *args: Any, **kwargs: Any) -> None:
        try:
            getattr(plugin, hook)(*args, **kwargs)
        except Exception:
            logger.exception("logging plugin %s failed in %s", type(plugin).__name__, hook)

    @contextlib.contextmanager
    def _around(self, hook: str, *args: Any) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for plugin in self.plugins:
                try:
                    stack.enter_context(_Guarded(plugin, hook, getattr(plugin, hook)(*args)))
                except Exception:
                    logger.exception("logging plugin %s failed in %s", type(plugin).__name__, hook)
            yield


class _Guarded:
    """A plugin's context manager that can neither swallow the work's error nor add its own."""

    def __init__(self, plugin: BaseLogger, hook: str, manager: Any) -> None:
        self._name = f"logging plugin {type(plugin).__name__} failed in {hook}"
        self._manager = manager

    def __enter__(self) -> None:
        self._manager.__enter__()

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        try:
            self._manager.__exit__(kind, error, traceback)
        except BaseException as raised:
            if raised is not error:
                logger.exception(self._name)


def _response(answer: Answer) -> Response:
    return Response(status_code=answer.status, headers=answer.headers, content=answer.body)
