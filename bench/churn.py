"""Churn under retention: do table sizes level off, what pruning costs, what it does to the API.

    python bench/churn.py [--rate 200] [--minutes 60] [--vacuum-every 10] [--only pruning|none]

Simulates an hour (``--minutes`` ticks, one simulated minute each, the
app's clock moved on a minute per tick) of steady churn through the API
application in process (Flask's test client: routing, the label service,
the statements; no HTTP server): every tick creates ``--rate`` labels, moves
the previous tick's labels on (``go``), moves those of the tick before to
their end state (``end``), and deletes a fifth of those by ``DELETE``; the
rest are left to ``finished:``. Retention is short: ``history: 10m``,
``deleted: 5m``, ``finished: 5m``.

It runs twice on a database of its own each (dropped afterwards):

- *pruning*: a thread runs the worker's pruning run (``prune``) over and
  over while the API works, as a worker would, with the simulated clock;
- *no retention*: the same churn, nothing pruned (1.x's behaviour).

Every ``--vacuum-every`` ticks the benchmark runs ``VACUUM`` on ``labels``
and ``history`` (standing in for autovacuum, whose one-minute naptime is
longer than the whole run). It prints, every ten ticks, the rows and the
on-disk size of ``history`` and ``labels`` (table and indexes), then the
API's latency (p50, p99 over every request) in each run, and pruning's cost
per row removed.

Needs a PostgreSQL server it may create databases on: ``DATABASE_URL``'s
host, port and user, else ``postgres@127.0.0.1:5432``.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from scratch import ScratchDatabase

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.db.plumbing.database import create_engine
from routemaster.db.upgrade import upgrade
from routemaster.service.retention import prune
from routemaster.web import create_app

CONFIG = """
{retention}
state_machines:
  order:
    states:
      - gate: placed
        triggers: [{{metadata: go}}]
        exit_condition: metadata.go = true
        next: packed
      - gate: packed
        triggers: [{{metadata: end}}]
        exit_condition: metadata.end = true
        next: delivered
      - gate: delivered
        exit_condition: false
"""

RETENTION = "retention:\n  history: 10m\n  deleted: 5m\n  finished: 5m\n"

SIZES = """
    SELECT relname, n_live_tup, pg_table_size(relid), pg_indexes_size(relid)
    FROM pg_stat_user_tables WHERE relname IN ('history', 'labels') ORDER BY relname
    """


class SimulatedClock:
    """Unix seconds in shared memory: the API's process moves it, the pruner's reads it."""

    def __init__(self) -> None:
        self.seconds = multiprocessing.Value("d", time.time())

    def __call__(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.seconds.value, datetime.UTC)

    def tick(self) -> None:
        with self.seconds.get_lock():
            self.seconds.value += 60


def pruner(url: str, config_path: str, clock: SimulatedClock, stop: Any, out: Any) -> None:
    """The worker's pruning run, over and over, in a process of its own (as a worker is)."""
    engine = create_engine(url)
    app = App(config=load_config([config_path]), db=engine, settings=Settings())
    app.clock = clock
    runs = []
    while not stop.is_set():
        started = time.perf_counter()
        report = prune(app)
        runs.append((time.perf_counter() - started, sum(report.rows.values())))
        stop.wait(0.05)
    out.put(runs)
    engine.dispose()


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def sizes(engine: sa.Engine) -> dict[str, tuple[int, int, int]]:
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE labels, history"))
        return {
            name: (rows, table, index) for name, rows, table, index in conn.execute(sa.text(SIZES))
        }


def run(rate: int, minutes: int, vacuum_every: int, *, pruning: bool) -> dict[str, Any]:
    scratch = ScratchDatabase(f"routemaster_bench_churn_{os.getpid()}_{int(pruning)}")
    engine = create_engine(scratch.url)
    try:
        upgrade(engine)
        folder = tempfile.mkdtemp()
        path = Path(folder) / "churn.yaml"
        path.write_text(CONFIG.format(retention=RETENTION if pruning else ""))
        config = load_config([path])
        clock = SimulatedClock()
        app = App(config=config, db=engine, settings=Settings(statement_timeout=30))
        app.clock = clock
        client = create_app(app).test_client()
        latencies: list[float] = []
        stop = multiprocessing.Event()
        out: Any = multiprocessing.Queue()

        def request(method: str, url: str, body: Any = None) -> None:
            started = time.perf_counter()
            response = client.open(url, method=method, json=body)
            latencies.append(time.perf_counter() - started)
            assert response.status_code < 300, response.get_data(as_text=True)

        process = multiprocessing.Process(
            target=pruner, args=(scratch.url, str(path), clock, stop, out)
        )
        if pruning:
            process.start()
        timeline = []
        base = "/state-machines/order/labels"
        for minute in range(1, minutes + 1):
            for n in range(rate):
                request("POST", f"{base}/m{minute}-{n}", {"metadata": {"n": n}})
            if minute > 1:
                for n in range(rate):
                    request("PATCH", f"{base}/m{minute - 1}-{n}", {"metadata": {"go": True}})
            if minute > 2:
                for n in range(rate):
                    request("PATCH", f"{base}/m{minute - 2}-{n}", {"metadata": {"end": True}})
                for n in range(0, rate, 5):
                    request("DELETE", f"{base}/m{minute - 2}-{n}")
            clock.tick()
            if vacuum_every and minute % vacuum_every == 0:
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(sa.text("VACUUM labels, history"))
            if minute % 10 == 0:
                timeline.append((minute, sizes(engine)))
        stop.set()
        runs: list[tuple[float, int]] = []
        if pruning:
            runs = out.get(timeout=60)
            process.join()
        busy = [run for run in runs if run[1]]
        return {
            "timeline": timeline,
            "requests": len(latencies),
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            "mean_ms": statistics.fmean(latencies) * 1000,
            "pruned": {
                "runs": len(runs),
                "rows": sum(rows for _, rows in busy),
                "seconds": sum(seconds for seconds, _ in busy),
                "idle_run_ms": statistics.median([s for s, r in runs if not r] or [0]) * 1000,
            },
        }
    finally:
        engine.dispose()
        scratch.drop()


def report(title: str, result: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(" minute | history rows | history table+idx KiB | labels rows | labels table+idx KiB")
    for minute, found in result["timeline"]:
        h, lab = found["history"], found["labels"]
        print(
            f" {minute:6d} | {h[0]:12d} | {h[1] // 1024:8d} + {h[2] // 1024:8d}    "
            f"| {lab[0]:11d} | {lab[1] // 1024:8d} + {lab[2] // 1024:8d}"
        )
    print(
        f" API: {result['requests']} requests, p50 {result['p50_ms']:.2f} ms, "
        f"p99 {result['p99_ms']:.2f} ms, mean {result['mean_ms']:.2f} ms"
    )
    pruned = result["pruned"]
    if pruned["rows"]:
        per_row = pruned["seconds"] / pruned["rows"] * 1e6
        print(
            f" pruning: {pruned['runs']} runs; those that pruned removed or deleted "
            f"{pruned['rows']} rows in {pruned['seconds']:.2f} s: {per_row:.0f} us per row; "
            f"a run with nothing to do: {pruned['idle_run_ms']:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=200, help="labels created per minute")
    parser.add_argument("--minutes", type=int, default=60, help="simulated minutes")
    parser.add_argument("--vacuum-every", type=int, default=10, help="ticks between VACUUMs")
    parser.add_argument(
        "--only", choices=("pruning", "none"), help="run one of the two (default: both)"
    )
    args = parser.parse_args()
    if args.only != "none":
        with_pruning = run(args.rate, args.minutes, args.vacuum_every, pruning=True)
        report("retention on, pruning while the API works", with_pruning)
    if args.only != "pruning":
        without = run(args.rate, args.minutes, args.vacuum_every, pruning=False)
        report("no retention (nothing pruned)", without)


if __name__ == "__main__":
    main()
