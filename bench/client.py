"""The pull-worker client's cost: tasks per second through ``routemaster.client.Worker`` against
the raw batch endpoint, and the time from a label becoming due to its handler starting.

    .venv/bin/python bench/client.py [--labels 3000] [--rounds 2] [--loops 4] [--samples 200]

Starts ``routemaster serve --workers 2 --no-worker`` on a fresh database (the
PostgreSQL server of ``BENCH_POSTGRES``, default postgres@127.0.0.1:5432), then,
``--rounds`` times in turn so that a busy machine weighs on both alike:

- raw: ``--loops`` threads each looping ``POST /tasks/complete`` (complete the last
  batch, claim the next 10), as docs/pull-workers.md's batch consumer does: at most
  ``loops * 10`` tasks in flight, no handler;
- raw, one loop: one thread of the same requests claiming ``loops * 10`` at a time (the
  client claims for all its free slots in one request, so this is its closest raw twin);
- client: one ``Worker`` with ``concurrency = loops * 10`` and a handler that returns
  ``{"done": True}`` at once: the same tasks in flight, through the client's slots,
  claimer, sender, heartbeat thread and a thread per task;

each over ``--labels`` labels created beforehand into the pull action (the time counted
is from the first claim to the last completion landed), with the CPU this process spent
per task (the client side's own cost, which a busy shared machine disturbs less than the
rates). Then the hand-over: a ``Worker``
(concurrency 4) waits on the service; labels are created one at a time and the time from
sending the create (the label enters the pull action, due at once, in that request) to the
handler starting is recorded; p50 and p99, next to the same figure for a raw waiting claim
(``bench/tasks.py``'s ``hand_over``: the task received, no handler).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tasks import (  # noqa: E402
    BATCH,
    CONFIG,
    create_rate,
    fresh_database,
    hand_over,
    in_threads,
    percentile,
    send_one_at_a_time,
    wait_until_serving,
)

from routemaster.client import Task, Worker  # noqa: E402


def raw_rate(base: str, loops: int, limit: int = BATCH) -> tuple[int, float]:
    """Tasks completed and seconds, by ``loops`` threads of one request per batch of ``limit``."""

    def loop(index: int) -> int:
        session = requests.Session()
        done: list[dict[str, Any]] = []
        count = 0
        while True:
            answer = session.post(
                f"{base}/tasks/complete",
                json={"tasks": done, "claim": {"worker": f"raw{index}", "limit": limit}},
            )
            assert answer.status_code == 200, answer.text
            reply = answer.json()
            count += sum(entry["status"] == 200 for entry in reply["completed"])
            done = [{"id": task["id"], "metadata": {"done": True}} for task in reply["tasks"]]
            if not done:
                return count

    return in_threads(loops, loop)


def client_rate(base: str, concurrency: int, total: int) -> tuple[int, float]:
    """Tasks completed and seconds, through one ``Worker`` with a handler that does nothing."""
    worker = Worker(base, state_machine="jobs", state="process", concurrency=concurrency, wait=1)
    handled = [0]
    lock = threading.Lock()
    first = threading.Event()

    @worker.task
    def handle(task: Task) -> dict[str, Any]:
        first.set()
        with lock:
            handled[0] += 1
        return {"done": True}

    thread = threading.Thread(target=worker.run, daemon=True)
    started = time.perf_counter()
    thread.start()
    book = worker._book  # the bench reads the client's own count of what it still holds
    while True:
        with lock:
            count = handled[0]
        with book.lock:
            settled = not book.held and not book.outcomes
        if count >= total and settled:
            break
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    worker.stop()
    thread.join(30)
    return count, seconds


def client_hand_over(base: str, samples: int) -> list[float]:
    """Seconds from sending a create to the handler starting, per label (one at a time)."""
    worker = Worker(base, state_machine="jobs", state="process", concurrency=4, wait=20)
    started: dict[str, float] = {}

    @worker.task
    def handle(task: Task) -> dict[str, Any]:
        started[task.label] = time.perf_counter()
        return {}

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    time.sleep(1.0)  # let the worker be waiting (a benchmark, not a test)
    sent = send_one_at_a_time(base, "client-handover", samples, started)
    worker.stop()
    thread.join(30)
    return [started[name] - sent[name] for name in sent if name in started]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--port", type=int, default=2818)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    server = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
    database = fresh_database(server, "routemaster_bench_client")
    env = {**os.environ, "DATABASE_URL": database}
    kinds = ("raw", "raw_one_loop", "client")
    results: dict[str, Any] = {f"{kind}_per_s": [] for kind in kinds}
    results |= {f"{kind}_cpu_ms_per_task": [] for kind in kinds}

    def record(kind: str, count: int, seconds: float, cpu: float) -> None:
        results[f"{kind}_per_s"].append(round(count / seconds, 1))
        results[f"{kind}_cpu_ms_per_task"].append(round(cpu / count * 1000, 3))

    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "tasks.yaml"
        config.write_text(CONFIG)
        command = [sys.executable, "-m", "routemaster", "-c", str(config)]
        subprocess.run([*command, "migrate"], env=env, check=True, cwd=ROOT)
        serve = [*command, "serve", "-b", f"127.0.0.1:{args.port}", "--workers", "2"]
        process = subprocess.Popen(
            [*serve, "--no-worker"], env=env, cwd=ROOT, stderr=subprocess.DEVNULL
        )
        base = f"http://127.0.0.1:{args.port}"
        try:
            wait_until_serving(base)
            for round_ in range(args.rounds):
                create_rate(base, f"r{round_}-", args.labels, 16)
                cpu = time.process_time()
                count, seconds = raw_rate(base, args.loops)
                record("raw", count, seconds, time.process_time() - cpu)
                create_rate(base, f"o{round_}-", args.labels, 16)
                cpu = time.process_time()
                count, seconds = raw_rate(base, 1, args.loops * BATCH)
                record("raw_one_loop", count, seconds, time.process_time() - cpu)
                create_rate(base, f"c{round_}-", args.labels, 16)
                cpu = time.process_time()
                count, seconds = client_rate(base, args.loops * BATCH, args.labels)
                record("client", count, seconds, time.process_time() - cpu)
            raw, client = results["raw_per_s"], results["client_per_s"]
            results["client_over_raw"] = round(statistics.fmean(client) / statistics.fmean(raw), 3)
            for name, latencies in (
                ("client_due_to_handler", client_hand_over(base, args.samples)),
                ("raw_due_to_task", hand_over(base, 4, args.samples)),
            ):
                results[f"{name}_samples"] = len(latencies)
                results[f"{name}_p50_ms"] = round(percentile(latencies, 0.5) * 1000, 2)
                results[f"{name}_p99_ms"] = round(percentile(latencies, 0.99) * 1000, 2)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
