"""The planner's statistics after ``migrate -c`` schedules a backfill of many labels.

    .venv/bin/python bench/stale_statistics.py --before /tmp/before [--labels 1000000] [--runs 7]

On a private PostgreSQL with autovacuum off (initdb in a temporary directory,
as bench/timers.py), once per tree (``--before``: a copy of another checkout,
e.g. ``git archive main | tar -x -C /tmp/before``; ``after``: this one), in a
database of its own: the schema migrated by the tree, ``--labels`` labels
written by SQL into a timer gate without a next check (a backfill) and
``ANALYZE``d as written (none due), then ``routemaster -c CONFIG migrate`` of
that tree, which schedules them all: every label due, in ``labels_due`` and
``labels_claimable``. Then, with this checkout's code (only what the tree's
``migrate`` left differs): the rows the planner believes ``labels`` and its
claim indexes hold, and the median time of what ``GET /receivers`` and the
``/metrics`` receiver gauges read (:func:`routemaster.service.receivers.receiver_statuses`)
and of the idle worker's next-due read, once per round
(:func:`routemaster.db.label_claims.next_due_at`), each after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from timers import _server as private_server  # noqa: E402

from routemaster.app import App  # noqa: E402
from routemaster.config import load_config  # noqa: E402
from routemaster.db.label_claims import next_due_at  # noqa: E402
from routemaster.service.receivers import receiver_statuses  # noqa: E402

CONFIG = """
state_machines:
  m:
    states:
      - gate: waiting
        triggers: [{event: timer}]
        exit_condition: metadata.go = true or 1h has passed since history.entered_state
        next: notify
      - action: notify
        webhook: http://127.0.0.1:9/hooks/<label>
        next: done
      - gate: done
        exit_condition: false
"""

FILL = """
    INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id, name_key,
                        shard_key)
    SELECT 'm', 'l-' || g, 'waiting', now(), 0, routemaster_label_key('l-' || g),
           routemaster_shard_key('l-' || g)
    FROM generate_series(%(first)s, %(last)s) AS g
    """

BELIEVED = """
    SELECT relname, reltuples FROM pg_class
    WHERE relname IN ('labels', 'labels_claimable', 'labels_due') ORDER BY relname
    """


def _median_ms(read: Callable[[], object], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        read()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[1:]), times[1:]


def _engine(url: str, **options: object) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://"), **options)


def _one_tree(server: str, name: str, tree: Path, labels: int, runs: int) -> None:
    admin = _engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS stale_{name}")
        conn.exec_driver_sql(f"CREATE DATABASE stale_{name}")
    admin.dispose()
    url = server.rsplit("/", 1)[0] + f"/stale_{name}"
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(tree)}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(CONFIG)
    python = [sys.executable, "-m", "routemaster"]
    subprocess.run([*python, "migrate"], env=env, check=True, cwd=tree, capture_output=True)
    engine = _engine(url)
    with engine.begin() as conn:
        for first in range(1, labels + 1, 200_000):
            params = {"first": first, "last": min(labels, first + 199_999)}
            conn.exec_driver_sql(FILL, params)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # the backfill as written (autovacuum, had it run, or an operator): no label due yet
        conn.exec_driver_sql("ANALYZE labels")
    started = time.perf_counter()
    done = subprocess.run(
        [*python, "-c", config.name, "migrate"], env=env, cwd=tree, capture_output=True, text=True
    )
    took = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    scheduled = [line for line in done.stderr.splitlines() if "Computed the next checks" in line]
    app = App(config=load_config([config.name]), db=engine)
    try:
        with engine.connect() as conn:
            believed = {str(n): int(float(r)) for n, r in conn.exec_driver_sql(BELIEVED).all()}

        def next_due() -> object:
            with engine.connect() as conn:
                return next_due_at(conn)

        receivers_ms, receivers_all = _median_ms(lambda: receiver_statuses(app), runs)
        next_due_ms, next_due_all = _median_ms(next_due, runs)
    finally:
        app.http.close()
        engine.dispose()
        os.unlink(config.name)
    print(f"== {name} ({tree})")
    print(f"migrate -c: {took:.1f} s ({scheduled[-1] if scheduled else 'nothing scheduled'})")
    print(f"planner believes: {believed}")
    print(
        f"receiver_statuses (GET /receivers, /metrics' receiver gauges): median "
        f"{receivers_ms:.1f} ms ({', '.join(f'{t:.1f}' for t in receivers_all)})"
    )
    print(
        f"next_due_at (the idle worker, each round): median {next_due_ms:.2f} ms "
        f"({', '.join(f'{t:.2f}' for t in next_due_all)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="the tree to compare with")
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with private_server(True) as server:
        admin = _engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:  # as on this machine's server and CI's
            conn.exec_driver_sql("ALTER SYSTEM SET autovacuum = off")
            conn.exec_driver_sql("SELECT pg_reload_conf()")
        admin.dispose()
        for name, tree in (("before", args.before.resolve()), ("after", REPO)):
            _one_tree(server, name, tree, args.labels, args.runs)


if __name__ == "__main__":
    main()
