"""The outage drill: a receiver answers 503 for a while, with many labels due for it.

    python bench/outage_drill.py [--labels 500] [--outage 120] [--workers 2]

A real ``routemaster cron`` (``--workers`` processes) delivers to a stub
receiver in this process, which answers 503 for ``--outage`` seconds from the
first call and 200 afterwards. The configuration is the defaults a user gets
(circuit: 10 failures, 30 s cooldown) with ``max_attempts: 3``. Reported:
labels errored (should be none), calls during the outage (the failures that
opened the circuit, then probes), labels delivered more than once after the
recovery (should be none), whether the backlog drained in the order it fell
due, and how long the drain took. Results in ``bench/results/outage-drill.json``.

Needs a PostgreSQL server it may create a database on: ``DATABASE_URL``
(host, port, user and password), else ``postgres@127.0.0.1:5432``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scratch import ScratchDatabase  # noqa: E402

from routemaster import service  # noqa: E402
from routemaster.app import App  # noqa: E402
from routemaster.config import load_config  # noqa: E402
from routemaster.db.database import create_engine  # noqa: E402

CONFIG = """
state_machines:
  drill:
    retry: {{max_attempts: 3}}
    states:
      - action: notify
        webhook: "http://127.0.0.1:{port}/hook/<label>"
        next: done
      - gate: done
        exit_condition: false
"""


class Receiver:
    """503 until ``outage`` seconds after the first call, then 200; every call recorded."""

    def __init__(self, outage: float) -> None:
        self.outage = outage
        self.first: float | None = None
        self.calls: list[tuple[float, str, int]] = []  # (time, label, status)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.monotonic()
                with receiver.lock:
                    if receiver.first is None:
                        receiver.first = now
                    status = 503 if now - receiver.first < receiver.outage else 200
                    receiver.calls.append((now, self.path.rsplit("/", 1)[1], status))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--labels", type=int, default=500)
    parser.add_argument("--outage", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    scratch = ScratchDatabase(f"bench_outage_{os.getpid()}")
    url = scratch.url
    receiver = Receiver(args.outage)
    workers: list[subprocess.Popen[bytes]] = []
    engine = None
    try:
        workdir = Path(tempfile.mkdtemp(prefix="outage-drill-"))
        config = workdir / "drill.yaml"
        config.write_text(CONFIG.format(port=receiver.port))
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
        subprocess.run(
            [sys.executable, "-m", "routemaster", "migrate"],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        engine = create_engine(url)
        app = App(config=load_config([config]), db=engine)
        machine = app.config.get_machine("drill")
        names = [f"l{i:04}" for i in range(args.labels)]
        for label in names:
            service.create_label(app, machine, label, {})
        for index in range(args.workers):
            log = (workdir / f"worker{index}.log").open("wb")
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "routemaster", "-c", str(config), "cron"],
                    env={**env, "ROUTEMASTER_WORKER_ID": f"drill-{index}"},
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        started = time.monotonic()
        done = 0
        while time.monotonic() - started < args.timeout:
            with engine.connect() as conn:
                done, errored = conn.execute(
                    sa.text(
                        "SELECT count(*) FILTER (WHERE state = 'done'),"
                        " count(*) FILTER (WHERE errored) FROM labels"
                    )
                ).one()
            if done + errored >= args.labels:
                break
            time.sleep(0.5)
        finished = time.monotonic()
        _stop(workers)  # so that they write the delivery log's last entries
        result = _report(receiver, engine, names, args, finished)
    finally:
        _stop(workers)
        if engine is not None:
            engine.dispose()
        receiver.server.shutdown()
        scratch.drop()
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "outage-drill.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


def _report(
    receiver: Receiver, engine: sa.Engine, names: list[str], args: Any, finished: float
) -> dict[str, Any]:
    with engine.connect() as conn:
        errored = conn.execute(sa.text("SELECT count(*) FROM labels WHERE errored")).scalar_one()
        done = conn.execute(
            sa.text("SELECT count(*) FROM labels WHERE state = 'done'")
        ).scalar_one()
        attempts = Counter(
            conn.execute(sa.text("SELECT attempts FROM labels WHERE errored")).scalars()
        )
        triggers = Counter(
            conn.execute(sa.text("SELECT trigger || ':' || outcome FROM deliveries")).scalars()
        )
        failing_first = set(
            conn.execute(
                sa.text(
                    "SELECT label FROM deliveries"
                    " WHERE trigger = 'scheduled' AND outcome <> 'delivered'"
                )
            ).scalars()
        )
    assert receiver.first is not None
    recovered = receiver.first + args.outage
    during = [call for call in receiver.calls if call[0] < recovered]
    after = [call for call in receiver.calls if call[0] >= recovered]
    delivered = Counter(label for _, label, status in receiver.calls if status == 200)
    twice = sorted(label for label, count in delivered.items() if count > 1)
    order = [label for _, label, status in after if status == 200 and label not in failing_first]
    # Calls run concurrently (slots x workers), so arrivals are in due order only roughly:
    # how far any label arrived from its place in that order.
    place = {label: index for index, label in enumerate(sorted(order))}
    displacement = max((abs(index - place[label]) for index, label in enumerate(order)), default=0)
    return {
        "labels": len(names),
        "outage_seconds": args.outage,
        "workers": args.workers,
        "max_attempts": 3,
        "circuit": "defaults: failures 10, cooldown 30s",
        "errored": errored,
        "errored_attempts": dict(attempts),
        "done": done,
        "calls_during_outage": len(during),
        "calls_after_recovery": len(after),
        "delivered_more_than_once": twice,
        "log_by_trigger_and_outcome": dict(triggers),
        "labels_that_failed_before_the_circuit_opened": len(failing_first),
        "backlog_labels": len(order),
        "backlog_most_out_of_order_by": displacement,
        "drain_seconds_after_recovery": round(finished - recovered, 1),
    }


if __name__ == "__main__":
    main()
