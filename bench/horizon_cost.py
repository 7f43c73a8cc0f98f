"""What confirming the changes stream's horizon costs on Citus (routemaster/db/horizon.py).

    .venv/bin/python bench/horizon_cost.py postgresql://root@127.0.0.1:9700/DB [--seconds 10]

``DB`` is a migrated (distributed) routemaster database on a Citus coordinator; the script
writes labels of a machine named ``bench-horizon`` into it. It prints:

1. each statement of a confirmation round, timed alone (median and 90th percentile of 50):
   the coordinator's horizon, Citus's commit records, the workers' prepared transactions;
2. for each kind of write load (labels created one per transaction, which touch one worker,
   and two per transaction on two workers, which commit in two phases), a run of
   ``--seconds`` in which one Horizon is asked every 20 ms (as a process's streams and
   subscription sender ask it): how many rounds read the commit records, how many asked
   the workers, what those cost, and how far the confirmed horizon trailed the coordinator's.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import threading
import time
import uuid

import sqlalchemy as sa

from routemaster.db import horizon as horizons
from routemaster.db import transitions
from routemaster.db.horizon import Horizon
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import fetch_all, fetch_value

MACHINE = "bench-horizon"


def timed(engine: sa.Engine, sql: str, times: int = 50) -> str:
    taken = []
    with engine.connect() as conn:
        for _ in range(times):
            started = time.perf_counter()
            fetch_all(conn, sql) if "pg_dist" in sql else fetch_value(conn, sql)
            taken.append((time.perf_counter() - started) * 1000)
            conn.commit()
    taken.sort()
    return f"median {statistics.median(taken):.2f} ms, p90 {taken[int(len(taken) * 0.9)]:.2f} ms"


def load(engine: sa.Engine, per_transaction: int, stop: threading.Event, made: list[int]) -> None:
    now = datetime.datetime.now(datetime.UTC)
    while not stop.is_set():
        with engine.begin() as conn:
            for _ in range(per_transaction):
                transitions.insert(conn, MACHINE, uuid.uuid4().hex, {}, state="a", now=now)
        made[0] += per_transaction


def run(engine: sa.Engine, per_transaction: int, seconds: float) -> str:
    horizon = Horizon()
    stop = threading.Event()
    made = [0]
    writers = [
        threading.Thread(target=load, args=(engine, per_transaction, stop, made)) for _ in range(2)
    ]
    for writer in writers:
        writer.start()
    trail = []
    ended = time.monotonic() + seconds
    with engine.connect() as conn:
        while time.monotonic() < ended:
            confirmed = horizon.confirmed(conn)
            trail.append(Horizon.coordinator(conn) - confirmed)
            conn.commit()
            time.sleep(0.02)
    stop.set()
    for writer in writers:
        writer.join()
    rounds = horizon.rounds
    asked = rounds.worker_rounds
    return (
        f"{made[0] / seconds:.0f} labels/s; {rounds.rounds / seconds:.1f} rounds/s, "
        f"{rounds.record_rounds / seconds:.1f}/s read the commit records, "
        f"{asked / seconds:.2f}/s asked the workers"
        + (f" ({rounds.worker_seconds / asked * 1000:.1f} ms each)" if asked else "")
        + f"; confirmed horizon behind the coordinator's by a median "
        f"{statistics.median(trail):.0f} transactions (max {max(trail)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    engine = create_engine(args.url)
    print("coordinator horizon:", timed(engine, horizons._COORDINATOR_HORIZON))
    print("commit records:     ", timed(engine, horizons._COMMIT_RECORDS))
    print("workers' prepared:  ", timed(engine, horizons._PREPARED))
    print("one label per transaction (one worker): ", run(engine, 1, args.seconds))
    print("two labels per transaction (two workers in half of them):", run(engine, 2, args.seconds))


if __name__ == "__main__":
    main()
