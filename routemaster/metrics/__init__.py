"""Prometheus metrics: made per process, fed by the same events as the logging plugins.

A :class:`Metrics` holds the counters and histograms (no module-level
registry). It hears transitions, webhook calls and feed fetches as an
internal logging plugin (:meth:`Metrics.observer`), so the label service and
the worker need no code of their own for it; the API times requests itself
(:mod:`routemaster.api.metrics`).

Under ``routemaster serve`` every gunicorn worker writes its values to files
in a directory that ``serve`` creates and removes
(prometheus-client's multiprocess mode), and ``GET /metrics`` sums them, so
one scrape sees the whole API. The gauges of labels per state are read from
the database by :class:`~routemaster.metrics.label_gauges.LabelGauges`.

Every label value comes from the configuration (machines, states, feeds) or
from a small fixed set (methods, outcomes, endpoint templates): label names
never become series.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from routemaster.db.deliveries import Delivery
from routemaster.logging import BaseLogger

MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Outbound calls: a delivery may take up to its timeout (10 s by default, configurable).
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The service's metrics; in multiprocess mode when ``multiprocess_dir`` is given.

    That mode must have been chosen before prometheus-client was first
    imported (it reads ``PROMETHEUS_MULTIPROC_DIR`` then), which ``serve`` does.
    """

    def __init__(self, *, multiprocess_dir: str | None = None) -> None:
        if multiprocess_dir is not None and not getattr(values.ValueClass, "_multiprocess", False):
            raise RuntimeError(
                f"prometheus_client was imported before {MULTIPROCESS_VARIABLE} was set"
            )
        self.multiprocess_dir = multiprocess_dir
        # In multiprocess mode values live in files, and exposition reads the files.
        self._own = CollectorRegistry()
        registry = None if multiprocess_dir else self._own
        self.requests = Counter(
            "routemaster_http_requests",
            "API requests answered, by method, endpoint template and status.",
            ["method", "endpoint", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "routemaster_http_request_duration_seconds",
            "Time to answer an API request (to its first byte for streamed listings).",
            ["method", "endpoint", "status"],
            registry=registry,
        )
        self._request_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self.transitions = Counter(
            "routemaster_transitions",
            "Labels moving from one state to another (to_state is empty for a deletion; "
            "creations are the API's POST requests).",
            ["state_machine", "from_state", "to_state"],
            registry=registry,
        )
        self._transition_series: dict[tuple[str, str, str], Counter] = {}
        self.children_spawned = Counter(
            "routemaster_children_spawned",
            "Child labels created by spawn states (SPEC G3), by the parent's machine and state.",
            ["state_machine", "state"],
            registry=registry,
        )
        self.spawn_decisions = Counter(
            "routemaster_spawn_decisions",
            "Parents that stopped waiting for their children and left a spawn state.",
            ["state_machine", "state"],
            registry=registry,
        )
        self.migrated = Counter(
            "routemaster_labels_migrated",
            "Labels taken out of a renamed or removed state by the configuration's migrations.",
            ["state_machine", "kind", "from_state", "to_state"],
            registry=registry,
        )
        self.webhook_calls = Counter(
            "routemaster_webhook_calls",
            "Action webhook deliveries by outcome (success, gone, failure, error).",
            ["state_machine", "state", "outcome"],
            registry=registry,
        )
        self.webhook_seconds = Histogram(
            "routemaster_webhook_duration_seconds",
            "Time an action webhook took to answer (or fail).",
            ["state_machine", "state", "outcome"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.feed_calls = Counter(
            "routemaster_feed_calls",
            "Feed fetches by outcome (success, failure, error).",
            ["state_machine", "feed", "outcome"],
            registry=registry,
        )
        self.feed_seconds = Histogram(
            "routemaster_feed_duration_seconds",
            "Time a feed took to answer (or fail).",
            ["state_machine", "feed", "outcome"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )

        self.subscription_batches = Counter(
            "routemaster_subscription_batches",
            "Push subscription batches sent, by subscription and outcome (success, failure, "
            "error: no answer).",
            ["subscription", "outcome"],
            registry=registry,
        )
        self.subscription_events = Counter(
            "routemaster_subscription_events",
            "Events acknowledged by push subscribers.",
            ["subscription"],
            registry=registry,
        )

        self.receiver_calls = Counter(
            "routemaster_receiver_calls",
            "Outbound calls (the delivery log's entries) by receiver, kind and outcome "
            "(delivered, accepted, failed, gone, timeout, network, throttled).",
            ["receiver", "kind", "outcome"],
            registry=registry,
        )
        self.receiver_seconds = Histogram(
            "routemaster_receiver_call_duration_seconds",
            "Time an outbound call to a receiver took, by receiver, kind and outcome.",
            ["receiver", "kind", "outcome"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.tasks = Counter(
            "routemaster_tasks",
            "Pull-worker tasks by event (claimed, completed, failed, released, expired).",
            ["state_machine", "state", "event"],
            registry=registry,
        )

        self.label_reads = Counter(
            "routemaster_label_reads",
            "Reads of one label (its GET, history, deliveries) by where they ran: on the Citus "
            "node holding its shard (node), or through DATABASE_URL (database).",
            ["route"],
            registry=registry,
        )
        self.label_writes = Counter(
            "routemaster_label_writes",
            "Writes of one label on Citus (a create, an update, a delete, an evaluation after "
            "feeds, a pull task's completion) by where they ran: on the node holding its shard "
            "(node), or through DATABASE_URL (database).",
            ["route"],
            registry=registry,
        )

        self.bulk_labels = Counter(
            "routemaster_bulk_labels",
            "Labels handled by bulk commands, by outcome (done, skipped, failed).",
            ["state_machine", "command", "outcome"],
            registry=registry,
        )

        # SPEC E1: gates evaluated at moments cost what moves, and the worker keeps up.
        self.occurrences = Counter(
            "routemaster_trigger_occurrences",
            "Interval and daily-time trigger occurrences handled by this worker, by gate "
            "(first: this worker recorded it first).",
            ["state_machine", "state", "first"],
            registry=registry,
        )
        self.occurrence_lag = Histogram(
            "routemaster_trigger_occurrence_lag_seconds",
            "How long after an occurrence the worker handled it, by gate.",
            ["state_machine", "state"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.gate_evaluated = Counter(
            "routemaster_gate_labels_evaluated",
            "Labels the worker evaluated in a gate because their due time came.",
            ["state_machine", "state"],
            registry=registry,
        )
        self.gate_moved = Counter(
            "routemaster_gate_labels_moved",
            "Labels the worker's evaluations moved out of a gate.",
            ["state_machine", "state"],
            registry=registry,
        )
        self.gate_lag = Histogram(
            "routemaster_gate_evaluation_lag_seconds",
            "How long after its due time (its next check's occurrence) a label was evaluated.",
            ["state_machine", "state"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.scheduled_late = Counter(
            "routemaster_labels_scheduled_late",
            "Labels whose next check the worker or migrate computed because the row was "
            "written without one (an upgrade, an older process, a renaming migration).",
            registry=registry,
        )
        # SPEC F3: whether this process hears NOTIFY or polls (routemaster.db.notifications).
        self.wakeups_listening = Gauge(
            "routemaster_wakeups_listening",
            "1 while wake-ups reach this listener by LISTEN (checked by a probe NOTIFY), 0 while "
            "they are polled every poll interval; by listener (worker, tokens, claims). Under "
            "serve, the lowest across its processes.",
            ["listener"],
            registry=registry,
            multiprocess_mode="min",
        )
        self.statement_timeouts = Counter(
            "routemaster_worker_statement_timeouts",
            "Worker statements cut off by the statement timeout, by the work they were doing "
            "(the rest of the worker carries on; the work is tried again).",
            ["work"],
            registry=registry,
        )

    def observe_occurrence(
        self, state_machine: str, state: str, *, lag: float, first: bool
    ) -> None:
        self.occurrences.labels(state_machine, state, "true" if first else "false").inc()
        self.occurrence_lag.labels(state_machine, state).observe(max(lag, 0.0))

    def observe_gate_evaluations(
        self, state_machine: str, state: str, *, evaluated: int, moved: int, lags: list[float]
    ) -> None:
        """One batch's evaluations in one gate: counts, and each label's lateness."""
        self.gate_evaluated.labels(state_machine, state).inc(evaluated)
        if moved:
            self.gate_moved.labels(state_machine, state).inc(moved)
        histogram = self.gate_lag.labels(state_machine, state)
        for lag in lags:
            histogram.observe(max(lag, 0.0))

    def observe_call(self, delivery: Delivery) -> None:
        """One outbound call, as the delivery log records it (per receiver, kind and outcome)."""
        labels = (delivery.receiver, delivery.kind, delivery.outcome)
        self.receiver_calls.labels(*labels).inc()
        self.receiver_seconds.labels(*labels).observe(delivery.duration_ms / 1000)

    @classmethod
    def from_environment(cls) -> Metrics:
        """Multiprocess when ``PROMETHEUS_MULTIPROC_DIR`` is set (as ``serve`` does)."""
        return cls(multiprocess_dir=os.environ.get(MULTIPROCESS_VARIABLE) or None)

    def observer(self) -> BaseLogger:
        """A logging plugin that counts what it hears; add it to the App's loggers."""
        return _Observer(self)

    def observe_subscription_batch(
        self, subscription: str, status: int | None, *, events: int, acknowledged: bool
    ) -> None:
        kind = "error" if status is None else "success" if 200 <= status < 300 else "failure"
        self.subscription_batches.labels(subscription, kind).inc()
        if acknowledged:
            self.subscription_events.labels(subscription).inc(events)

    def observe_request(self, method: str, endpoint: str, status: int, seconds: float) -> None:
        key = (method if method in METHODS else "other", endpoint, status)
        series = self._request_series.get(key)
        if series is None:  # once per method, endpoint and status: labels() takes a lock
            labels = (key[0], endpoint, str(status))
            series = (self.requests.labels(*labels), self.request_seconds.labels(*labels))
            self._request_series[key] = series
        series[0].inc()
        series[1].observe(seconds)

    def count_transition(self, state_machine: str, from_state: str, to_state: str) -> None:
        key = (state_machine, from_state, to_state)
        series = self._transition_series.get(key)
        if series is None:  # once per machine and pair of states: labels() takes a lock
            series = self._transition_series[key] = self.transitions.labels(*key)
        series.inc()

    def listening(self, listener: str) -> Callable[[bool], None]:
        """What a :class:`~routemaster.db.notifications.Listener` tells whether it listens."""
        gauge = self.wakeups_listening.labels(listener)

        def report(listening: bool) -> None:
            gauge.set(1 if listening else 0)

        return report

    def wakeups(self) -> dict[str, bool]:
        """Per listener that has reported, whether its wake-ups arrive by ``LISTEN`` (true) or
        are polled: what ``routemaster_wakeups_listening`` says in /metrics (under serve, the
        lowest across its processes), for the console."""
        heard: dict[str, bool] = {}
        for family in self.registry().collect():
            if family.name == "routemaster_wakeups_listening":
                for sample in family.samples:
                    heard[sample.labels["listener"]] = sample.value >= 1
        return dict(sorted(heard.items()))

    def registry(self, *extra: Collector) -> CollectorRegistry:
        """What to expose: this process's values, or every process's in multiprocess mode."""
        if self.multiprocess_dir is None:
            registry = self._own
        else:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        for collector in extra:
            registry.register(collector)
        return registry


def outcome(status: int | None) -> str:
    """``success`` (2xx), ``gone`` (410), ``failure`` (any other status), ``error`` (no answer)."""
    if status is None:
        return "error"
    if 200 <= status < 300:
        return "success"
    return "gone" if status == 410 else "failure"


class _Observer(BaseLogger):
    """Counts what the hooks report.

    Webhook calls are counted from 1.x's ``process_webhook`` (around one
    delivery, naming the action's state) and ``webhook_response`` (its
    answer, inside it, on the same thread); no answer counts as ``error``.
    """

    def __init__(self, metrics: Metrics) -> None:
        super().__init__(None)
        self._metrics = metrics
        self._deliveries = threading.local()  # the delivery each thread is in

    # The events' fields are BaseLogger's (the plugin API's, declared there once).

    def transition(self, **event: Any) -> None:
        self._metrics.count_transition(
            event["state_machine"], event["old_state"] or "", event["new_state"] or ""
        )

    @contextlib.contextmanager
    def process_webhook(self, state_machine: Any, state: Any) -> Iterator[None]:
        delivery = _Delivery(time.monotonic())
        outer = getattr(self._deliveries, "current", None)
        self._deliveries.current = delivery
        try:
            yield
        finally:
            self._deliveries.current = outer
            labels = (state_machine.name, state.name, outcome(delivery.status))
            self._metrics.webhook_calls.labels(*labels).inc()
            self._metrics.webhook_seconds.labels(*labels).observe(
                time.monotonic() - delivery.started
            )

    def webhook_response(self, state_machine: Any, state: Any, response: Any) -> None:
        delivery = getattr(self._deliveries, "current", None)
        if delivery is not None:
            delivery.status = response.status_code

    def feed_fetched(self, **event: Any) -> None:
        result = outcome(event["status"])
        labels = (event["state_machine"], event["feed"], "failure" if result == "gone" else result)
        self._metrics.feed_calls.labels(*labels).inc()
        self._metrics.feed_seconds.labels(*labels).observe(event["duration"])

    def task_event(self, **event: Any) -> None:
        labels = (event["state_machine"], event["state"], event["event"])
        self._metrics.tasks.labels(*labels).inc()


@dataclass
class _Delivery:
    started: float
    status: int | None = None
