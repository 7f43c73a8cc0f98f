"""The published 1.x logging plugins, installed from PyPI, work with real serve and cron processes.

``routemaster-prometheus``, ``routemaster-statsd`` and ``routemaster-sentry``
1.5.0 (installed with ``--no-deps`` by ``scripts/test``, beside what they
import) are configured as a 1.x user would; their metrics, StatsD lines and
Sentry events must move for API requests, webhook deliveries, feed fetches
and worker jobs, and a 500 must reach a (local, fake) Sentry.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import requests

from tests.serving import free_port, stop
from tests.stub_server import Reply, StubServer, running_stub
from tests.waiting import wait_until

REPOSITORY = Path(__file__).resolve().parents[1]
PLUGINS = ("routemaster-prometheus", "routemaster-statsd", "routemaster-sentry")
BULK = 20


def _require_plugins() -> None:
    for name in PLUGINS:
        try:
            assert version(name) == "1.5.0", f"{name} {version(name)} installed, test wants 1.5.0"
        except PackageNotFoundError:
            pytest.fail(f"{name} is not installed: ./scripts/test installs the published plugins")


class StatsdListener:
    """A UDP socket on 127.0.0.1 keeping every datagram received, as StatsD would."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.lines.extend(data.decode().splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _sentry_events(sentry: StubServer) -> list[str]:
    """The bodies raven posted to the store endpoint, decompressed."""
    bodies = []
    for request in sentry.received("/api/1/store/"):
        try:
            bodies.append(zlib.decompress(request.body).decode())
        except zlib.error:
            bodies.append(request.body.decode(errors="replace"))
    return bodies


def _samples(text: str, name: str, **labels: str) -> float:
    """The sum of Prometheus samples called ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match.group(4))
    return total


def _worker_metrics(directory: Path) -> str:
    """The worker's metrics, read from its multiprocess files as the plugin's endpoint would."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return generate_latest(registry).decode()


@pytest.fixture
def receivers() -> Iterator[tuple[StubServer, StubServer, StatsdListener]]:
    """The webhook and feed receiver, a fake Sentry, and a fake StatsD."""
    for stub in running_stub():
        for sentry in running_stub():
            statsd = StatsdListener()
            try:
                yield stub, sentry, statsd
            finally:
                statsd.close()


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "routemaster", *args],
            cwd=REPOSITORY,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
@pytest.mark.parametrize("deployment", ["serve", "serve --no-worker + cron"])
def test_published_plugins_see_requests_webhooks_feeds_cron_jobs_and_errors(
    tmp_path: Path,
    database_url: str,
    db_engine: object,
    receivers: tuple[StubServer, StubServer, StatsdListener],
    deployment: str,
) -> None:
    """As 1.x users deploy: ``serve`` alone (its worker's values at the API's ``/metrics``),
    or the API with separate workers (each its own ``prometheus_multiproc_dir``)."""
    _require_plugins()
    stub, sentry, statsd = receivers
    stub.reply_json("/stock/a", {"available": 1})
    # b's feed is down for the API's evaluation, then up for the worker's retry.
    stub.script("/stock/b", Reply(503), Reply(200, json.dumps({"available": 2}).encode()))
    sentry_port = sentry.url("/").split(":")[2].rstrip("/")
    config = tmp_path / "config.yaml"
    config.write_text(
        "state_machines:\n"
        "  orders:\n"
        "    feeds:\n"
        f"      - {{name: stock, url: '{stub.url('/stock/<label>')}'}}\n"
        "    states:\n"
        "      - gate: placed\n"
        "        triggers: [{metadata: go}]\n"
        "        exit_condition: metadata.go = true and feeds.stock.available > 0\n"
        "        next: notify\n"
        "      - action: notify\n"
        f"        webhook: '{stub.url('/hooks/<label>')}'\n"
        "        next: done\n"
        "      - gate: done\n"
        "        exit_condition: false\n"
        "  bulk:\n"
        "    states:\n"
        "      - action: notify\n"
        f"        webhook: '{stub.url('/bulk/<label>')}'\n"
        "        next: done\n"
        "      - gate: done\n"
        "        exit_condition: false\n"
        "plugins:\n"
        "  logging:\n"
        "    - class: routemaster_prometheus:PrometheusLogger\n"
        "    - class: routemaster_statsd:StatsDLogger\n"
        f"      kwargs: {{host: 127.0.0.1, port: {statsd.port}}}\n"
        "    - class: routemaster_sentry:SentryLogger\n"
        f"      kwargs: {{dsn: 'http://public:secret@127.0.0.1:{sentry_port}/1'}}\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("DB_")}
    env.update(
        DATABASE_URL=database_url,
        ROUTEMASTER_EVALUATION_RETRY_DELAY="0.2",
        ROUTEMASTER_POLL_INTERVAL="0.1",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    api_metrics, worker_metrics = tmp_path / "api-metrics", tmp_path / "worker-metrics"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    alone = deployment == "serve"
    serve = _spawn(
        ["-c", str(config), "serve", "-b", f"127.0.0.1:{port}", "--workers", "1"]
        + ([] if alone else ["--no-worker"]),
        {**env, "prometheus_multiproc_dir": str(api_metrics)},
        tmp_path / "serve.log",
    )
    cron = (
        serve
        if alone
        else _spawn(
            ["-c", str(config), "cron"],
            {**env, "prometheus_multiproc_dir": str(worker_metrics)},
            tmp_path / "cron.log",
        )
    )
    worker_log = tmp_path / ("serve.log" if alone else "cron.log")
    try:
        session = requests.Session()

        def answers() -> bool:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return session.get(base + "/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(answers, "serve answering", timeout=30)
        labels = f"{base}/state-machines/orders/labels"
        for name in ("a", "b"):
            assert session.post(f"{labels}/{name}", json={"metadata": {}}).status_code == 201
            assert session.patch(f"{labels}/{name}", json={"metadata": {"go": True}}).ok

        def both_done() -> bool:
            assert cron.poll() is None, worker_log.read_text()
            states = [session.get(f"{labels}/{name}").json()["state"] for name in ("a", "b")]
            return states == ["done", "done"]

        wait_until(both_done, "a and b moved through the feed gate and the webhook", timeout=30)
        check = session.get(base + "/check-loggers")
        assert check.status_code == 500
        assert check.json() == {"message": "Internal server error."}
        wait_until(
            lambda: any("LoggerCheckError" in event for event in _sentry_events(sentry)),
            "the 500 of GET /check-loggers reaching Sentry",
            timeout=30,
        )
        # statsd-python sends in packets of up to 1,432 bytes: enough traffic to send the above.
        bulk = f"{base}/state-machines/bulk/labels"
        for number in range(BULK):
            assert session.post(f"{bulk}/{number}", json={"metadata": {}}).status_code == 201
        bulk_hooks = [f"/bulk/{number}" for number in range(BULK)]
        wait_until(
            lambda: {request.path for request in stub.received()} >= set(bulk_hooks),
            "the bulk webhooks delivered",
            timeout=30,
        )
        for _ in range(BULK):
            session.get(base + "/")

        def counted_metrics() -> str | None:
            """/metrics once the worker has counted every bulk webhook it delivered (under
            serve the worker's counters are read there; a receiver sees a webhook just before
            the worker counts it)."""
            text = session.get(base + "/metrics").text
            counted = _samples(text, "webhook_requests_total", state_machine="bulk")
            return text if not alone or counted == BULK else None

        api = wait_until(counted_metrics, "the worker's webhook counters at /metrics", timeout=30)
        # The worker's StatsD lines leave as they happen, not when a packet is full.
        wait_until(
            lambda: len([line for line in statsd.lines if "webhook_requests" in line]) == 2 + BULK,
            lambda: statsd.lines,
            timeout=30,
        )
    finally:
        stop(serve)
        stop(cron)

    # Prometheus, API process: request latencies by endpoint and status, the feed calls it made.
    count = "routemaster_api_request_duration_seconds_count"
    assert _samples(api, count, method="POST", status="201") == 2 + BULK
    assert _samples(api, count, method="GET", endpoint="/check-loggers", status="500") == 1
    placed = {"state_machine": "orders", "state": "placed"}
    # a's feed read by the API; b's retry by the worker, also at the API's /metrics under serve.
    assert _samples(api, "feed_requests_total", **placed, status_code="200") == (2 if alone else 1)
    assert _samples(api, "feed_requests_total", **placed, status_code="503") == 1
    assert _samples(api, "exceptions_total", type="feed") == 1
    # Prometheus, worker: the webhooks, b's feed retry, and 1.x's jobs (each action state and
    # metadata-triggered gate a minute, the first at start). At the API's /metrics under serve.
    worker = api if alone else _worker_metrics(worker_metrics)
    notify = {"state_machine": "orders", "state": "notify"}
    assert _samples(worker, "webhook_requests_total", **notify, status_code="200") == 2
    assert _samples(worker, "webhook_requests_total", state_machine="bulk") == BULK
    retried = _samples(worker, "feed_requests_total", **placed, status_code="200")
    assert retried == (2 if alone else 1)
    jobs = "cron_jobs_processed_total"
    assert _samples(worker, jobs, fn_name="process_action", **notify) >= 1
    assert _samples(worker, jobs, fn_name="process_action", state_machine="bulk") >= 1
    assert _samples(worker, jobs, fn_name="process_gate", **placed) >= 1
    assert _samples(worker, jobs, state="done") == 0  # no job for a gate without triggers
    if alone:  # routemaster's own metrics of the worker, beside the plugin's
        calls = "routemaster_webhook_calls_total"
        assert _samples(api, calls, **notify, outcome="success") == 2
        assert _samples(api, calls, state_machine="bulk", outcome="success") == BULK

    # StatsD: the same events as lines (namespace "routemaster", tags after "#").
    def sent(metric: str, **tags: str) -> int:
        wanted = [f"{key}:{value}" for key, value in tags.items()]
        return sum(
            1
            for line in statsd.lines
            if line.startswith(f"routemaster.{metric}:")
            and all(tag in line.partition("#")[2].split(",") for tag in wanted)
        )

    assert sent("api_request_duration", method="POST", status="201") >= 2
    assert sent("api_request_duration", method="GET", endpoint="/check-loggers", status="500") == 1
    assert sent("feed_requests", **placed, status_code="503") == 1
    assert sent("feed_requests", **placed, status_code="200") == 2  # a's in the API, b's retry
    assert sent("exceptions", type="feed") == 1
    assert sent("webhook_requests", **notify, status_code="200") == 2
    assert sent("cron_jobs_processed", fn_name="process_action", **notify) >= 1
    assert sent("cron_jobs_processed", fn_name="process_gate", **placed) >= 1
    assert sent("exceptions", type="api") == 0  # Flask answered the 500 itself
