"""Flow keys under a burst (SPEC G2): small keys' waits behind one big key, and a claim's cost.

    python bench/flows.py [--big 100000] [--keys 1000] [--per-key 10] [--slots 20]
                          [--delay 0.01] [--after 10] [--cost-keys 10,100000]

**Fairness.** One key (``big``) with ``--big`` labels due first, then ``--keys`` keys with
``--per-key`` labels each, all due at the start, in one webhook action with
``flow: {key: metadata.customer}``; one worker (``Worker`` in a thread) with ``--slots``
delivery slots, calling a receiver in this process that answers after ``--delay`` seconds
(``max_in_flight`` = slots). Measured from the worker's start: when each small key's
labels were called (their p50/p99 wait), the call rate R, and the big key's rate for
``--after`` seconds once the small keys are done. Compared with the fair-share ideal (K+1
equal keys served in turn: a small label waits for its round, the last round after
``per_key * (K+1) / R``) and with today's order, oldest due first, in which every small
label waits behind the whole big key (``(big + rank) / R``, computed from the measured R).

**Cost per round.** ``--cost-keys`` flows of that many active keys (two queued labels
each), for each one claim round for 10 slots, timed in a transaction rolled back (50
rounds): the time and the rows the round read.

Needs a PostgreSQL server it may create a database on (``DATABASE_URL``, else
``postgres@127.0.0.1:5432``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from routemaster.app import App, Settings  # noqa: E402
from routemaster.config import load_config  # noqa: E402
from routemaster.db.plumbing.database import create_engine  # noqa: E402
from routemaster.service.flow_claims import flow_states, serve_flow  # noqa: E402
from routemaster.worker import Worker  # noqa: E402

CONFIG = """
state_machines:
  m:
    states:
      - action: notify
        webhook: http://127.0.0.1:{port}/hook/<label>
        flow: {{key: metadata.customer}}
        next: done
      - gate: done
        exit_condition: false
receivers:
  - {{match: '127\\.0\\.0\\.1', max_in_flight: {slots}}}
"""

# Labels inserted due in the action: the big key's first (a second in the past, in order),
# then the small keys' (each key's labels in order, keys interleaved as they arrive).
_INSERT = """
    WITH wanted AS (
        SELECT name, customer, due_at FROM unnest(CAST(:names AS text[]),
                                                  CAST(:customers AS text[]),
                                                  CAST(:dues AS timestamptz[]))
               AS w(name, customer, due_at)
    ), h AS (
        INSERT INTO history (state_machine, label, old_state, new_state, created, shard_key)
        SELECT 'm', name, NULL, 'notify', now(), routemaster_shard_key(name) FROM wanted
        RETURNING id, label, shard_key
    )
    INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                        due_at, name_key, shard_key)
    SELECT 'm', h.label, jsonb_build_object('customer', wanted.customer), 'notify', now(), h.id,
           wanted.due_at, routemaster_label_key(h.label), h.shard_key
    FROM h JOIN wanted ON wanted.name = h.label
    """


class Calls:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[str, float] = {}


@contextmanager
def receiver(delay: float, calls: Calls) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            at = time.monotonic()
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            label = self.path.rsplit("/", 1)[-1]
            with calls.lock:
                calls.started.setdefault(label, at)
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def insert(engine: sa.Engine, rows: list[tuple[str, str, Any]], batch: int = 20_000) -> None:
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        with engine.begin() as conn:
            conn.execute(
                sa.text(_INSERT),
                {
                    "names": [r[0] for r in chunk],
                    "customers": [r[1] for r in chunk],
                    "dues": [r[2] for r in chunk],
                },
            )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))]


def fairness(url: str, args: argparse.Namespace) -> None:
    calls = Calls()
    engine = create_engine(url, pool_size=5, max_overflow=30)
    with receiver(args.delay, calls) as port:
        config = Path(tempfile.mkdtemp(prefix="flows-")) / "flows.yaml"
        config.write_text(CONFIG.format(port=port, slots=args.slots))
        app = App(
            config=load_config([config]),
            db=engine,
            settings=Settings(poll_interval=0.5, delivery_concurrency=args.slots),
        )
        with engine.begin() as conn:
            base = conn.execute(sa.text("SELECT now() - interval '1 hour'")).scalar_one()
        import datetime

        big = [
            (f"big-{i:06}", "big", base + datetime.timedelta(milliseconds=i))
            for i in range(args.big)
        ]
        late = base + datetime.timedelta(milliseconds=args.big + 1)
        small = [
            (
                f"k{k:05}-{i:02}",
                f"k{k:05}",
                late + datetime.timedelta(microseconds=i * args.keys + k),
            )
            for i in range(args.per_key)
            for k in range(args.keys)
        ]
        t0 = time.monotonic()
        insert(engine, big + small)
        print(f"inserted {len(big) + len(small)} labels in {time.monotonic() - t0:.1f} s")
        small_names = {name for name, _, _ in small}
        worker = Worker(app)
        thread = threading.Thread(target=worker.run, daemon=True)
        started = time.monotonic()
        thread.start()
        while True:
            with calls.lock:
                done = sum(1 for name in small_names if name in calls.started)
            if done == len(small_names):
                break
            if time.monotonic() - started > 1800:
                raise SystemExit("the small keys were not served within 30 minutes")
            time.sleep(0.2)
        small_done = time.monotonic()
        with calls.lock:
            big_before = sum(1 for name in calls.started if name.startswith("big-"))
        time.sleep(args.after)
        with calls.lock:
            big_after = sum(1 for name in calls.started if name.startswith("big-"))
            starts = dict(calls.started)
        worker.stop()
        thread.join(30)
    waits = [starts[name] - started for name in small_names]
    total = len(starts)
    rate = len([s for s in starts.values() if s <= small_done]) / (small_done - started)
    keys = args.keys + 1
    ideal = [(i // args.keys + 1) * keys / rate for i in range(len(small_names))]
    today = [(args.big + i + 1) / rate for i in range(len(small_names))]
    print(f"calls made: {total}; call rate while the small keys waited: {rate:.0f}/s")
    print(
        f"small keys' wait: p50 {percentile(waits, 50):.2f} s, p99 {percentile(waits, 99):.2f} s,"
        f" max {max(waits):.2f} s"
    )
    print(
        f"fair-share ideal at that rate: p50 {percentile(ideal, 50):.2f} s,"
        f" p99 {percentile(ideal, 99):.2f} s"
    )
    print(
        f"today's order (oldest due first) at that rate: p50 {percentile(today, 50):.2f} s,"
        f" p99 {percentile(today, 99):.2f} s"
    )
    print(
        f"big key during the small keys: {big_before} calls; after them:"
        f" {(big_after - big_before) / args.after:.0f} calls/s (all slots)"
    )


def cost(url: str, keys: int, slots: int = 10, rounds: int = 50) -> None:
    engine = create_engine(url, pool_size=2)
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE labels, history, flow_keys, flows"))
    config = Path(tempfile.mkdtemp(prefix="flows-")) / "flows.yaml"
    config.write_text(CONFIG.format(port=9, slots=slots))
    app = App(config=load_config([config]), db=engine, settings=Settings())
    import datetime

    with engine.begin() as conn:
        base = conn.execute(sa.text("SELECT now() - interval '1 hour'")).scalar_one()
    rows = [
        (f"c{k:06}-{i}", f"c{k:06}", base + datetime.timedelta(microseconds=i * keys + k))
        for i in range(max(2, 200_000 // keys))
        for k in range(keys)
    ]
    insert(engine, rows)
    [flow] = list(flow_states(app.config).values())
    with engine.begin() as conn:  # queue them all (as claims do, in batches)
        from routemaster.db import flows

        while flows.enqueue(conn, flow, now=app.now(), limit=50_000):
            pass
        conn.execute(sa.text("ANALYZE labels"))
        conn.execute(sa.text("ANALYZE flow_keys"))
    times = []
    for _ in range(rounds):
        with engine.connect() as conn:
            transaction = conn.begin()
            t = time.perf_counter()
            taken = serve_flow(
                conn,
                flow,
                slots,
                now=app.now(),
                lease_until=app.now() + datetime.timedelta(seconds=30),
                worker_id="bench",
            )
            times.append(time.perf_counter() - t)
            transaction.rollback()
        assert len(taken.claims) == slots
    millis = [x * 1000 for x in times]
    print(
        f"{keys} active keys, {len(rows)} queued labels: one round for {slots} slots:"
        f" median {statistics.median(millis):.2f} ms, p90 {percentile(millis, 90):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--per-key", type=int, default=10)
    parser.add_argument("--slots", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--after", type=float, default=10.0)
    parser.add_argument("--cost-keys", default="10,100000")
    parser.add_argument("--skip-fairness", action="store_true")
    args = parser.parse_args()

    from scratch import ScratchDatabase

    scratch = ScratchDatabase(f"bench_flows_{os.getpid()}")
    try:
        env = {**os.environ, "DATABASE_URL": scratch.url, "PYTHONPATH": str(ROOT)}
        subprocess.run(
            [sys.executable, "-m", "routemaster", "migrate"],
            env=env,
            check=True,
            capture_output=True,
        )
        if not args.skip_fairness:
            fairness(scratch.url, args)
        for keys in [int(k) for k in args.cost_keys.split(",") if k]:
            cost(scratch.url, keys)
    finally:
        scratch.drop()


if __name__ == "__main__":
    main()
