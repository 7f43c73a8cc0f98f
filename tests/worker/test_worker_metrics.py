"""``routemaster cron --metrics-bind``: the worker's webhook, feed and transition metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from tests.serving import free_port
from tests.stub_server import StubServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
state_machines:
  flow:
    feeds:
      - name: info
        url: {stub}/feed/<label>
    states:
      - action: notify
        webhook: {stub}/hook/<label>
        next: check
      - gate: check
        triggers:
          - event: entry
        exit_condition: feeds.info.ok = true
        next: end
      - gate: end
        exit_condition: false
"""


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_the_worker_serves_its_metrics_on_the_given_port(
    database_url: str, db_engine: sa.Engine, stub: StubServer, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    stub.reply_json("/feed/a", {"ok": True})
    port = free_port()
    env = dict(os.environ, DATABASE_URL=database_url, ROUTEMASTER_POLL_INTERVAL="0.2")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "cron.log"
    command = [sys.executable, "-m", "routemaster", "-c", str(config), "cron"]
    command += ["--metrics-bind", f"127.0.0.1:{port}"]
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        app = App(config=load_config([config]), db=db_engine)
        service.create_label(app, app.config.get_machine("flow"), "a", {})
        url = f"http://127.0.0.1:{port}/metrics"
        wanted = {
            ("routemaster_webhook_calls_total", ("state", "notify"), ("outcome", "success")),
            ("routemaster_feed_calls_total", ("feed", "info"), ("outcome", "success")),
            ("routemaster_transitions_total", ("from_state", "notify"), ("to_state", "check")),
            ("routemaster_transitions_total", ("from_state", "check"), ("to_state", "end")),
        }
        seen: dict[Any, float] = {}

        def all_counted() -> dict[Any, float] | None:
            assert process.poll() is None, log.read_text()
            try:
                seen.update(samples := _samples(url))
            except OSError:
                return None
            found = {
                want
                for want in wanted
                for name, label_set in samples
                if name == want[0]
                and set(want[1:]) <= set(label_set)
                and samples[(name, label_set)] == 1
            }
            return samples if found == wanted else None

        samples = wait_until(
            all_counted, lambda: (wanted, sorted(seen), log.read_text()), timeout=30, every=0.1
        )
        durations = [
            value
            for (name, label_set), value in samples.items()
            if name == "routemaster_webhook_duration_seconds_count"
            and ("state", "notify") in label_set
        ]
        assert durations == [1.0]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0, log.read_text()
    assert f"Metrics on http://127.0.0.1:{port}/metrics" in log.read_text()
