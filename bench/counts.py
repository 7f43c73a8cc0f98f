"""Kept label counts (issue 36, SPEC F2): reads of per-state counts and moves at 1M labels,
two checkouts turn about.

    .venv/bin/python bench/counts.py BEFORE_TREE AFTER_TREE [--labels 1000000] [--rounds 3]
        [--moves-seconds 20] [--clients 4] [--private-server]

Each checkout gets a scratch database of its own (``DATABASE_URL``'s server; with
``--private-server`` a PostgreSQL cluster of its own in a temporary directory),
migrated by that checkout and filled the same way: ``--labels`` labels with
their first history entry, 60% in ``flow``'s gate ``start`` (the ones moved
below), 30% in ``flow``'s ``end``, 10% in ``timed``'s ``wait``. A checkout
whose ``migrate`` has ``--recount`` counts them then (timed: the seed of the
kept counts of a database that already holds them).

Then ``--rounds`` rounds, the order of the checkouts alternating every round;
in each, per checkout, ``serve --workers 2`` (its worker too: the fold of kept
counts runs there) with ``ROUTEMASTER_LABEL_GAUGES_INTERVAL=0`` (every
scrape counts), and:

- its start (until ``/`` answers), in seconds;
- each read five times (after one warm-up), the median wall time in ms:
  ``/metrics``, the console's index and ``flow`` machine page,
  ``GET /state-machines/flow`` and ``GET /receivers``;
- moves only: ``--clients`` threads PATCH ``{"go": true}`` onto labels waiting
  in ``start`` (each PATCH moves one label to ``review``) for ``--moves-seconds``;
  moves per second.

It prints each run, then per figure the median of each side and the median of
the per-round ratios (after / before): a paired comparison, so load elsewhere
on a shared machine disturbs it less than two separate runs.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scratch import ScratchDatabase  # noqa: E402
from timers import _server as server_for  # noqa: E402

READS = {
    "metrics": "/metrics",
    "console_index": "/console/",
    "console_machine": "/console/machines/flow",
    "machine": "/state-machines/flow",
    "receivers": "/receivers",
}

FILL = """
    WITH wanted AS (
        SELECT g, nextval(pg_get_serial_sequence('history', 'id')) AS id,
               now() - random() * interval '1 day' AS at
        FROM generate_series(%(first)s, %(last)s) AS g
    ), entries AS (
        INSERT INTO history (id, state_machine, label, old_state, new_state, created, shard_key)
        SELECT id, %(sm)s, %(prefix)s || g, NULL, %(state)s, at,
               routemaster_shard_key(%(prefix)s || g)
        FROM wanted
    )
    INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                        created_at, updated_at, name_key, shard_key)
    SELECT %(sm)s, %(prefix)s || g, '{}', %(state)s, at, id, at, at,
           routemaster_label_key(%(prefix)s || g), routemaster_shard_key(%(prefix)s || g)
    FROM wanted
"""

# (machine, state, name prefix, share of the labels)
SHARES = (("flow", "start", "m-", 0.6), ("flow", "end", "e-", 0.3), ("timed", "wait", "w-", 0.1))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _env(tree: str, url: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DB_")}
    env.update(
        PYTHONPATH=tree,
        DATABASE_URL=url,
        ROUTEMASTER_LABEL_GAUGES_INTERVAL="0",
    )
    return env


def _routemaster(tree: str, url: str, *args: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "routemaster", *args],
        cwd=tree,
        env=_env(tree, url),
        check=True,
        capture_output=True,
    )
    return time.monotonic() - started


def prepare(tree: str, url: str, labels: int) -> dict[str, Any]:
    """Migrate with the checkout, fill, recount where the checkout can."""
    _routemaster(tree, url, "migrate")
    engine = sa.create_engine(url)
    started = time.monotonic()
    with engine.begin() as conn:
        for machine, state, prefix, share in SHARES:
            total = int(labels * share)
            for first in range(1, total + 1, 100_000):
                last = min(first + 99_999, total)
                conn.exec_driver_sql(
                    FILL,
                    {
                        "first": first,
                        "last": last,
                        "sm": machine,
                        "state": state,
                        "prefix": prefix,
                    },
                )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE labels")
        conn.exec_driver_sql("VACUUM ANALYZE history")
    engine.dispose()
    report: dict[str, Any] = {"fill_seconds": round(time.monotonic() - started, 1)}
    if "--recount" in (Path(tree) / "routemaster" / "cli" / "database.py").read_text():
        report["recount_seconds"] = round(_routemaster(tree, url, "migrate", "--recount"), 2)
    return report


def _get(conn: http.client.HTTPConnection, path: str) -> float:
    started = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status}")
    return (time.perf_counter() - started) * 1000


def _moves(port: int, first: int, seconds: float, clients: int) -> tuple[float, int]:
    """Moves per second by ``clients`` threads for ``seconds``; the next unused label."""
    counter = iter(range(first, 10**9))
    lock = threading.Lock()
    done = [0] * clients
    stop = time.monotonic() + seconds
    failures: list[str] = []

    def client(slot: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < stop:
            with lock:
                i = next(counter)
            conn.request(
                "PATCH",
                f"/state-machines/flow/labels/m-{i}",
                body=b'{"metadata": {"go": true}}',
                headers={"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(f"m-{i}: {response.status}")
                return
            done[slot] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"moves failed: {failures[:3]}")
    with lock:
        following = next(counter)
    return sum(done) / (time.monotonic() - started), following


def run_side(tree: str, url: str, first: int, args: argparse.Namespace) -> tuple[dict, int]:
    port = _free_port()
    started = time.monotonic()
    log = open(Path(args.log_dir) / f"serve-{port}.log", "w")  # noqa: SIM115 (closed below)
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "routemaster",
            "-c",
            str(REPO / "bench" / "bench.yaml"),
            "serve",
            "-b",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
        ],
        cwd=tree,
        env=_env(tree, url),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                _get(http.client.HTTPConnection("127.0.0.1", port, timeout=30), "/")
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        figures: dict[str, Any] = {"start_s": round(time.monotonic() - started, 2)}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for name, path in READS.items():
            _get(conn, path)
            figures[f"{name}_ms"] = round(statistics.median(_get(conn, path) for _ in range(5)), 1)
        rate, following = _moves(port, first, args.moves_seconds, args.clients)
        figures["moves_per_s"] = round(rate, 1)
        return figures, following
    except Exception:
        print(f"serve's log: {log.name}", file=sys.stderr)
        raise
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--moves-seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--private-server", action="store_true")
    parser.add_argument("--log-dir", default=tempfile.gettempdir(), help="serve's logs go here")
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    with server_for(args.private_server) as server:
        os.environ["DATABASE_URL"] = server
        scratch = {side: ScratchDatabase(f"bench_counts_{side}_{os.getpid()}") for side in trees}
        try:
            for side, tree in trees.items():
                print(side, "prepared", prepare(tree, scratch[side].url, args.labels), flush=True)
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            following = {"before": 1, "after": 1}
            for round_ in range(args.rounds):
                order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
                for side in order:
                    figures, following[side] = run_side(
                        trees[side], scratch[side].url, following[side], args
                    )
                    runs[side].append(figures)
                    print(round_, side, figures, flush=True)
        finally:
            for database in scratch.values():
                database.drop()
    for figure in runs["before"][0]:
        before = [run[figure] for run in runs["before"]]
        after = [run[figure] for run in runs["after"]]
        ratios = [a / b for a, b in zip(after, before, strict=True) if b]
        print(
            f"{figure}: {statistics.median(before)} -> {statistics.median(after)} (medians); "
            f"after/before per round: median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
