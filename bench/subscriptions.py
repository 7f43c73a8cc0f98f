"""Push subscriptions: events/s to one and to 20 subscribers, and commit-to-arrival latency.

    .venv/bin/python bench/subscriptions.py [--seconds 8] [--subscribers 20]

On a fresh database (created and dropped here, on the server of
``DATABASE_URL``, default postgres@127.0.0.1:5432):

1. **API create rate**: ``routemaster serve`` (2 workers) and 8 client
   threads creating labels as fast as they can for ``--seconds``, while a
   ``routemaster cron`` worker sends them to a live subscriber (default
   ``batch_delay_ms`` 500): how long after the last create it had them all.
2. **One fast subscriber**: a subscription from before those labels
   (``max_events`` 100, ``batch_delay_ms`` 0), one ``routemaster cron``
   worker; events/s from its first batch's arrival to its last.
   The backlog is the labels of step 1 plus ``--backlog`` more (20,000), made
   through the label service in-process, so the drain is long enough to time.
3. **20 subscribers** at once on the same backlog: events/s over all of them.
4. **Latency** at ``batch_delay_ms`` 100: labels created through the API at a
   steady 100/s for ``--seconds`` while the worker follows; for each event,
   its arrival at the receiver minus the moment its POST was *sent* (so the
   figure is an upper bound on commit-to-arrival); p50 and p99.

The receiver is an in-process HTTP/1.1 server answering 200 at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scratch import ScratchDatabase  # noqa: E402

from routemaster.db.plumbing.database import create_engine  # noqa: E402
from routemaster.db.upgrade import upgrade  # noqa: E402

CONFIG = """
subscriptions:
  allow: ['^http://127\\.0\\.0\\.1:']
state_machines:
  m:
    states:
      - gate: start
        exit_condition: false
"""


class Receiver:
    """Records, per subscription, when each event (by label) arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: dict[str, dict[str, float]] = {}
        self.batches: dict[str, list[float]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                now = time.time()
                batch = json.loads(body)
                with receiver.lock:
                    seen = receiver.arrivals.setdefault(batch["subscription"], {})
                    for event in batch["events"]:
                        seen.setdefault(event["label"], now)
                    receiver.batches.setdefault(batch["subscription"], []).append(now)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/events"

    def count(self, name: str) -> int:
        with self.lock:
            return len(self.arrivals.get(name, {}))

    def span(self, names: list[str]) -> float:
        with self.lock:
            times = [t for name in names for t in self.batches.get(name, [])]
        return max(times) - min(times)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--backlog", type=int, default=20_000, help="more labels, made in-process")
    args = parser.parse_args()
    scratch = ScratchDatabase(f"routemaster_bench_subs_{uuid.uuid4().hex[:8]}")
    url = scratch.url
    try:
        engine = create_engine(url)
        upgrade(engine)
        engine.dispose()
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp), url, args)
    finally:
        scratch.drop()


def start(tmp: Path, url: str, *command: str, log: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    with (tmp / log).open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "routemaster", "-c", str(tmp / "config.yaml"), *command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


def subscribe(api: str, name: str, receiver: Receiver, **fields: Any) -> None:
    answer = requests.put(f"{api}/subscriptions/{name}", json={"url": receiver.url(), **fields})
    assert answer.status_code in (200, 201), answer.text


def run(tmp: Path, url: str, args: argparse.Namespace) -> None:
    (tmp / "config.yaml").write_text(CONFIG)
    receiver = Receiver()
    port = 20_000 + os.getpid() % 10_000
    api = f"http://127.0.0.1:{port}"
    serve = start(tmp, url, "serve", "-b", f"127.0.0.1:{port}", "--workers", "2", log="serve.log")
    try:
        wait_for(lambda: _answers(api), 30, "the API")
        names = ["fast"] + [f"sub{i:02}" for i in range(args.subscribers)]

        # 1. the API flat out, a live subscriber following it (default batch_delay_ms 500)
        subscribe(api, "live", receiver, max_events=100)
        worker = start(tmp, url, "cron", log="cron-live.log")
        try:
            time.sleep(2)  # the worker is up and following
            made = create_flat_out(api, args.seconds)
            ended = time.time()
            wait_for(lambda: receiver.count("live") >= made, 120, "the live subscriber")
        finally:
            stop(worker)
        with receiver.lock:
            last = max(receiver.arrivals["live"].values())
        rate = made / args.seconds
        print(f"API create rate: {made} labels in {args.seconds:.0f} s = {rate:,.0f}/s")
        print(
            f"a live subscriber (max_events 100, batch_delay_ms 500) had every event "
            f"{(last - ended) * 1000:.0f} ms after the last create answered"
        )
        requests.delete(f"{api}/subscriptions/live")
        created = made + create_backlog(tmp, url, args.backlog)

        # 2. one fast subscriber alone on the backlog
        subscribe(api, "fast", receiver, max_events=100, batch_delay_ms=0, after="0-0")
        worker = start(tmp, url, "cron", log="cron1.log")
        try:
            wait_for(lambda: receiver.count("fast") >= created, 300, "the fast subscriber")
        finally:
            stop(worker)
        span = receiver.span(["fast"])
        print(
            f"one subscriber (batches of 100): {created} events in {span:.2f} s = "
            f"{created / span:,.0f} events/s ({created / span / rate:.1f}x the API create rate)"
        )

        # 3. 20 subscribers on the same backlog
        for subscription in names[1:]:
            subscribe(api, subscription, receiver, max_events=100, batch_delay_ms=0, after="0-0")
        worker = start(tmp, url, "cron", log="cron20.log")
        try:
            wait_for(
                lambda: all(receiver.count(s) >= created for s in names[1:]),
                600,
                "20 subscribers",
            )
        finally:
            stop(worker)
        span = receiver.span(names[1:])
        total = created * args.subscribers
        print(
            f"{args.subscribers} subscribers: {total} events in {span:.2f} s = "
            f"{total / span:,.0f} events/s in all ({total / span / args.subscribers:,.0f} each)"
        )
        for subscription in names:
            requests.delete(f"{api}/subscriptions/{subscription}")

        # 4. latency at batch_delay_ms 100, a steady 100 labels/s
        subscribe(api, "latency", receiver, max_events=100, batch_delay_ms=100)
        worker = start(tmp, url, "cron", log="cron-latency.log")
        try:
            time.sleep(2)  # the worker is up and following
            sent = create_steady(api, per_second=100, seconds=args.seconds)
            wait_for(lambda: receiver.count("latency") >= len(sent), 60, "latency events")
        finally:
            stop(worker)
        with receiver.lock:
            arrived = receiver.arrivals["latency"]
        delays = sorted((arrived[label] - at) * 1000 for label, at in sent.items())
        p50 = statistics.median(delays)
        p99 = delays[int(len(delays) * 0.99) - 1]
        print(
            f"commit-to-arrival at batch_delay_ms 100 ({len(delays)} events at 100/s): "
            f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {delays[-1]:.0f} ms"
        )
    finally:
        stop(serve)


def _answers(api: str) -> bool:
    try:
        return requests.get(api + "/", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def create_flat_out(api: str, seconds: float, clients: int = 8) -> int:
    counts = [0] * clients
    deadline = time.monotonic() + seconds

    def client(index: int) -> None:
        session = requests.Session()
        while time.monotonic() < deadline:
            answer = session.post(
                f"{api}/state-machines/m/labels/c{index}-{counts[index]}", json={"metadata": {}}
            )
            assert answer.status_code == 201, answer.text
            counts[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def create_backlog(tmp: Path, url: str, count: int, threads: int = 4) -> int:
    """``count`` more labels through the label service (no HTTP): a backlog to drain."""
    from routemaster import service
    from routemaster.app import App
    from routemaster.config import load_config

    engine = create_engine(url)
    app = App(config=load_config([tmp / "config.yaml"]), db=engine)
    machine = app.config.get_machine("m")

    def make(offset: int) -> None:
        for index in range(offset, count, threads):
            service.create_label(app, machine, f"b{index}", {})

    workers = [threading.Thread(target=make, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    engine.dispose()
    return count


def create_steady(api: str, *, per_second: int, seconds: float) -> dict[str, float]:
    session = requests.Session()
    sent: dict[str, float] = {}
    started = time.monotonic()
    for index in range(int(per_second * seconds)):
        time.sleep(max(0.0, started + index / per_second - time.monotonic()))
        label = f"lat{index}"
        sent[label] = time.time()
        answer = session.post(f"{api}/state-machines/m/labels/{label}", json={"metadata": {}})
        assert answer.status_code == 201, answer.text
    return sent


if __name__ == "__main__":
    main()
