"""Reading feeds for one evaluation: over HTTP, once each, with no transaction open."""

from __future__ import annotations

from typing import Any

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.config.receiver_rules import origin_of, receiver_id
from routemaster.db import deliveries
from routemaster.exit_conditions import FeedUnavailable
from routemaster.http.calls import Call
from routemaster.http.feeds import fetch_feed
from routemaster.service.transactions import writing


class FeedFetcher:
    """Fetches a label's feeds on first read and remembers each answer (failures too).

    :meth:`read` fetches; :meth:`fetched` only answers from what was already
    read, for planning again inside a transaction.
    """

    def __init__(
        self, app: App, machine: StateMachine, label: str, *, state: str, timeout: float
    ) -> None:
        self._app = app
        self._machine = machine
        self._label = label
        self._state = state  # where the evaluation starts: told to the plugins
        self._timeout = timeout
        self._answers: dict[str, Any] = {}
        self._failures: dict[str, FeedUnavailable] = {}

    def read(self, feed: str) -> Any:
        if feed not in self._answers and feed not in self._failures:
            url = self._machine.feed(feed).url
            try:
                # A failed fetch raises inside the plugins' process_feed, as in 1.x.
                state = self._machine.get_state(self._state)
                with self._app.hooks.feed(self._machine, state, url) as log_response:
                    self._answers[feed] = fetch_feed(
                        self._app.http,
                        self._machine,
                        feed,
                        self._label,
                        timeout=self._timeout,
                        observe=self._observe(feed),
                        max_response_bytes=self._app.settings.max_response_body,
                        max_depth=self._app.settings.max_json_depth,
                        on_response=log_response,
                        on_call=self._recorder(feed),
                    )
            except FeedUnavailable as failure:
                self._failures[feed] = failure
        return self.fetched(feed)

    def fetched(self, feed: str) -> Any:
        if feed in self._failures:
            raise self._failures[feed]
        if feed not in self._answers:
            raise FeedUnavailable(feed, "not fetched yet")
        return self._answers[feed]

    def _recorder(self, feed: str) -> Any:
        """Writes each fetch to the delivery log (its own statement, after the fetch)."""

        def record(call: Call) -> None:
            entry = deliveries.entry_for(
                call,
                kind="feed",
                receiver=receiver_id(origin_of(self._machine.feed(feed).url)),
                trigger="scheduled",
                attempt=None,
                state_machine=self._machine.name,
                label=self._label,
                state=self._state,
            )
            with writing(self._app) as conn:
                deliveries.record(conn, [entry])
            if self._app.metrics is not None:
                self._app.metrics.observe_call(entry)

        return record

    def _observe(self, feed: str) -> Any:
        def observe(url: str, status: int | None, duration: float) -> None:
            self._app.hooks.feed_fetched(
                state_machine=self._machine.name,
                label=self._label,
                feed=feed,
                url=url,
                status=status,
                duration=duration,
            )

        return observe
