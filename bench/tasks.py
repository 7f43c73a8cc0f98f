"""Pull workers under load: claim + complete throughput, and hand-over latency to a waiting claim.

    .venv/bin/python bench/tasks.py [--labels 2000] [--consumers 16] [--workers 2]
        [--batch-labels 6000 --processes 4 --threads 4] [--only-batch]

Starts ``routemaster serve --workers N --no-worker`` (or plain ``serve`` if the
flag does not exist) on a fresh database, then measures, with the same Python
client for each figure:

- the create rate of the API (16 concurrent clients creating labels), the
  reference the worker path must keep up with;
- claim + complete throughput with 16 concurrent consumers, ``limit`` 1 and 10,
  of labels waiting in a pull action;
- the hand-over latency: 16 consumers wait in ``/tasks/claim`` with ``wait``;
  labels are created one at a time and the time from sending the create
  (the label enters the pull action in that request) to a consumer receiving
  its task is recorded; p50 and p99;
- in the same run, into the same action: the create rate of ``--batch-labels``
  labels, then claim + complete through ``POST /tasks/complete`` (each request
  completes the last batch and claims the next 10), consumers in
  ``--processes`` processes of ``--threads`` threads so the client is not the
  limit; and the ratio of the two (SPEC E4 asks for at least 2).

Needs the PostgreSQL server named by DATABASE_URL (default
postgres@127.0.0.1:5432) with the right to create databases.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests
import sqlalchemy as sa

from routemaster.db.plumbing.database import create_engine

ROOT = Path(__file__).resolve().parents[1]
BATCH = 10
CONFIG = """
state_machines:
  jobs:
    states:
      - action: process
        worker: {lease: 1m}
        next: done
      - gate: done
        exit_condition: false
"""


def fresh_database(server_url: str, name: str) -> str:
    admin = create_engine(f"{server_url}/postgres").execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.engine.dispose()
    return f"{server_url}/{name}"


def in_threads(count: int, work: Callable[[int], int]) -> tuple[int, float]:
    """Run ``work(index)`` in ``count`` threads; total of what they return, and the seconds."""
    results = [0] * count
    barrier = threading.Barrier(count + 1)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = work(index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(results), time.perf_counter() - started


def create_rate(base: str, prefix: str, total: int, clients: int) -> float:
    def work(index: int) -> int:
        session = requests.Session()
        done = 0
        for n in range(index, total, clients):
            response = session.post(
                f"{base}/state-machines/jobs/labels/{prefix}{n}", json={"metadata": {"n": n}}
            )
            assert response.status_code == 201, response.text
            done += 1
        return done

    count, seconds = in_threads(clients, work)
    return count / seconds


def claim_complete_rate(base: str, consumers: int, limit: int) -> float:
    def work(index: int) -> int:
        session = requests.Session()
        done = 0
        while True:
            answer = session.post(
                f"{base}/tasks/claim", json={"worker": f"c{index}", "limit": limit}
            )
            tasks = answer.json()["tasks"]
            if not tasks:
                return done
            for task in tasks:
                finished = session.post(f"{base}/tasks/{task['id']}/complete", json={})
                assert finished.status_code == 200, finished.text
                done += 1

    count, seconds = in_threads(consumers, work)
    return count / seconds


def _batch_consumer(base: str, index: int, threads: int, go: Any, results: Any) -> None:
    """One consumer process: ``threads`` loops of one request per batch of 10, until empty."""

    def loop(worker: str) -> int:
        session = requests.Session()
        done: list[dict[str, Any]] = []
        count = 0
        while True:
            answer = session.post(
                f"{base}/tasks/complete",
                json={"tasks": done, "claim": {"worker": worker, "limit": BATCH}},
            )
            assert answer.status_code == 200, answer.text
            reply = answer.json()
            assert all(entry["status"] == 200 for entry in reply["completed"]), reply
            count += len(reply["completed"])
            done = [{"id": task["id"], "metadata": {"done": True}} for task in reply["tasks"]]
            if not done:
                return count

    go.wait()
    total, _ = in_threads(threads, lambda t: loop(f"p{index}t{t}"))
    results.put(total)


def batch_rate(base: str, processes: int, threads: int) -> float:
    """Claim + complete through ``POST /tasks/complete`` (batches of 10), consumers in
    ``processes`` processes of ``threads`` threads each, so the client is not the limit."""
    context = multiprocessing.get_context("spawn")
    go, results = context.Event(), context.Queue()
    workers = [
        context.Process(target=_batch_consumer, args=(base, i, threads, go, results))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # let every process import and wait (a benchmark, not a test)
    started = time.perf_counter()
    go.set()
    count = sum(results.get(timeout=600) for _ in workers)
    seconds = time.perf_counter() - started
    for worker in workers:
        worker.join()
    return count / seconds


def send_one_at_a_time(
    base: str, prefix: str, samples: int, seen: Mapping[str, float]
) -> dict[str, float]:
    """Create ``samples`` jobs labels, each once the last is in ``seen`` (or after 5 s), so
    the consumers are back to waiting; when each was sent (``time.perf_counter``)."""
    session = requests.Session()
    sent: dict[str, float] = {}
    for n in range(samples):
        name = f"{prefix}{n}"
        sent[name] = time.perf_counter()
        session.post(f"{base}/state-machines/jobs/labels/{name}", json={"metadata": {}})
        deadline = time.perf_counter() + 5
        while name not in seen and time.perf_counter() < deadline:
            time.sleep(0.0005)
        time.sleep(0.01)  # one label at a time: consumers back to waiting
    return sent


def hand_over(base: str, consumers: int, samples: int) -> list[float]:
    """Seconds from sending a create to a waiting consumer holding the task, per label."""
    received: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def consume(index: int) -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                answer = session.post(
                    f"{base}/tasks/claim",
                    json={"worker": f"h{index}", "limit": 1, "wait": 2},
                    timeout=10,
                )
                now = time.perf_counter()
                for task in answer.json()["tasks"]:
                    with lock:
                        received[task["label"]] = now
                    session.post(f"{base}/tasks/{task['id']}/complete", json={})
            except requests.RequestException:
                return  # the server is stopping

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(consumers)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let every consumer be waiting (a benchmark, not a test)
    sent = send_one_at_a_time(base, "handover", samples, received)
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    return [received[name] - sent[name] for name in sent if name in received]


def wait_until_serving(base: str, timeout: float = 30) -> None:
    """Return once the service at ``base`` answers, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(base + "/", timeout=2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=2000)
    parser.add_argument("--consumers", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--port", type=int, default=2817)
    parser.add_argument("--batch-labels", type=int, default=6000)
    parser.add_argument("--processes", type=int, default=4, help="batch consumer processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per consumer process")
    parser.add_argument("--only-batch", action="store_true", help="skip the single-task paths")
    args = parser.parse_args()
    server = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
    database = fresh_database(server, "routemaster_bench_tasks")
    env = {**os.environ, "DATABASE_URL": database}
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "tasks.yaml"
        config.write_text(CONFIG)
        command = [sys.executable, "-m", "routemaster", "-c", str(config)]
        subprocess.run([*command, "migrate"], env=env, check=True, cwd=ROOT)
        serve = [*command, "serve", "-b", f"127.0.0.1:{args.port}", "--workers", str(args.workers)]
        help_text = subprocess.run(
            [*command, "serve", "--help"], env=env, capture_output=True, text=True, cwd=ROOT
        ).stdout
        if "--no-worker" in help_text:
            serve.append("--no-worker")
        process = subprocess.Popen(serve, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{args.port}"
        try:
            wait_until_serving(base)
            results: dict[str, float] = {}
            c = args.consumers
            if not args.only_batch:
                results["create_per_s"] = create_rate(base, "a", args.labels, c)
                results["claim_complete_limit1_per_s"] = claim_complete_rate(base, c, 1)
                create_rate(base, "b", args.labels, c)
                results["claim_complete_limit10_per_s"] = claim_complete_rate(base, c, 10)
            if args.batch_labels:
                # In one run, into the same action: the create rate, then the batch path.
                creates = create_rate(base, "c", args.batch_labels, c)
                results["batch_create_per_s"] = creates
                batched = batch_rate(base, args.processes, args.threads)
                results["batch10_claim_complete_per_s"] = batched
                results["batch10_over_create"] = batched / creates
            if not args.only_batch:
                latencies = hand_over(base, c, args.samples)
                results["handover_samples"] = len(latencies)
                results["handover_p50_ms"] = percentile(latencies, 0.5) * 1000
                results["handover_p99_ms"] = percentile(latencies, 0.99) * 1000
                results["handover_mean_ms"] = statistics.fmean(latencies) * 1000
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(json.dumps({key: round(value, 2) for key, value in results.items()}, indent=2))


if __name__ == "__main__":
    main()
