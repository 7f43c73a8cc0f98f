"""A logging plugin written the 1.x way, recording every hook it is called on."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from routemaster.logging import BaseLogger


class Recorder(BaseLogger):
    """Built as 1.x builds plugins: ``Recorder(config, **kwargs)``."""

    def __init__(self, config: Any, *, name: str = "recorder") -> None:
        super().__init__(config)
        self.name = name
        self.events: list[tuple[Any, ...]] = []

    def init_flask(self, flask_app: Any) -> None:
        self.events.append(("init_flask", flask_app.name))

    def process_request_started(self, environ: dict[str, Any]) -> None:
        self.events.append(("request_started", environ["REQUEST_METHOD"], environ["PATH_INFO"]))

    def process_request_finished(
        self, environ: dict[str, Any], *, status: str, headers: Any, exc_info: Any
    ) -> None:
        self.events.append(("request_finished", environ["PATH_INFO"], status, exc_info))

    @contextlib.contextmanager
    def process_cron(self, state_machine: Any, state: Any, fn_name: str) -> Iterator[None]:
        self.events.append(("cron", state_machine.name, state.name, fn_name))
        with self._failures("cron"):
            yield

    @contextlib.contextmanager
    def process_webhook(self, state_machine: Any, state: Any) -> Iterator[None]:
        self.events.append(("webhook", state_machine.name, state.name))
        with self._failures("webhook"):
            yield

    def webhook_response(self, state_machine: Any, state: Any, response: Any) -> None:
        self.events.append(("webhook_response", state.name, response.status_code))

    @contextlib.contextmanager
    def process_feed(self, state_machine: Any, state: Any, feed_url: str) -> Iterator[None]:
        self.events.append(("feed", state_machine.name, state.name, feed_url))
        with self._failures("feed"):
            yield

    def feed_response(self, state_machine: Any, state: Any, feed_url: str, response: Any) -> None:
        self.events.append(("feed_response", state.name, response.status_code))

    def exception(self, message: str, *args: Any, **kwargs: Any) -> None:
        error = sys.exc_info()[1]
        self.events.append(("exception", message, type(error).__name__))

    def named(self, kind: str) -> list[tuple[Any, ...]]:
        return [event for event in self.events if event[0] == kind]

    @contextlib.contextmanager
    def _failures(self, kind: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            self.events.append((f"{kind} failed", type(error).__name__))
            raise


class Broken(BaseLogger):
    """Every hook raises: the service must carry on regardless."""

    def process_request_started(self, environ: dict[str, Any]) -> None:
        raise RuntimeError("broken plugin")

    def process_request_finished(
        self, environ: dict[str, Any], *, status: str, headers: Any, exc_info: Any
    ) -> None:
        raise RuntimeError("broken plugin")

    def process_cron(self, state_machine: Any, state: Any, fn_name: str) -> Any:
        raise RuntimeError("broken plugin")

    def webhook_response(self, state_machine: Any, state: Any, response: Any) -> None:
        raise RuntimeError("broken plugin")

    @contextlib.contextmanager
    def process_webhook(self, state_machine: Any, state: Any) -> Iterator[None]:
        with contextlib.suppress(Exception):  # swallows the work's error, which 1.x forbade
            yield
        raise RuntimeError("broken plugin")  # and fails on the way out


class Refuses(BaseLogger):
    """Refuses to start, as routemaster-prometheus does without its directory variable."""

    def __init__(self, config: Any) -> None:
        raise ValueError("set the environment variable FOO")
