"""Child labels at scale (issue 44, SPEC G3): a parent with 100,000 items, one ``cron``.

    .venv/bin/python bench/children.py [--items 100000] [--small 20] [--in-place]

In a scratch database on ``DATABASE_URL``'s server, or with ``--in-place`` in
``DATABASE_URL``'s database itself (on Citus: a database whose coordinator lists
the workers, such as the one ``cluster.sh start`` prints; ``routemaster migrate``
distributes the tables there, and the benchmark's labels stay):

1. A parent is created (through the service, as the API does) in a spawn
   state whose list has ``--items`` elements; one ``routemaster cron`` spawns
   the children. Reported: the time from the parent's creation until the
   last child exists, and the rate; the parent row's size
   (``pg_column_size``) before the first child and after the last.
2. Every child but one is put in its ``outcome: succeeded`` state straight
   in the tables (the bench's shortcut: no word for the parent), then the last
   one is moved by a metadata update through the service, as a client's
   PATCH would: reported, the time from that update's commit until the
   parent has left the spawn state (the parent counts all 100,000 children
   then), and the time one count takes.
3. ``--small`` parents of 10 children each: each one's last child finished
   through the service, the parent's decision latency each time (p50, max).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scratch import ScratchDatabase  # noqa: E402

from routemaster import service  # noqa: E402
from routemaster.app import App  # noqa: E402
from routemaster.config import load_config  # noqa: E402
from routemaster.db.plumbing.database import create_engine  # noqa: E402

CONFIG = """
state_machines:
  order:
    states:
      - spawn: pick
        machine: item
        for_each: metadata.items
        wait: all
        next: done
      - gate: done
        exit_condition: false
  item:
    states:
      - gate: waiting
        exit_condition: metadata.ok = true
        triggers:
          - metadata: ok
        next: picked
      - gate: picked
        exit_condition: false
        outcome: succeeded
"""

ROW_SIZE = """
    SELECT pg_column_size(labels.*) FROM labels
    WHERE state_machine = 'order' AND name = %(name)s
"""
SPAWNED = """
    SELECT spawned, total FROM spawns
    WHERE state_machine = 'order' AND name_key = convert_to(%(name)s, 'UTF8')
"""
STATE = "SELECT state FROM labels WHERE state_machine = 'order' AND name = %(name)s"
FINISH_ALL_BUT = """
    UPDATE labels SET state = 'picked'
    WHERE state_machine = 'item' AND name <> %(last)s AND state = 'waiting'
      AND starts_with(name, %(prefix)s)
"""
RECORD_ALL_BUT = """
    UPDATE children SET outcome = 'succeeded'
    WHERE parent_name = %(parent)s AND name <> %(last)s
"""
COUNT = """
    SELECT outcome, count(*) FROM children
    WHERE parent_machine = 'order' AND parent_key = convert_to(%(name)s, 'UTF8')
      AND state_machine = 'item'
    GROUP BY outcome
"""


def _value(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.exec_driver_sql(sql, params).first()


def _wait(check: Any, timeout: float, every: float = 0.005) -> float:
    """Seconds until ``check()`` is true (fails after ``timeout``)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError("not within the timeout")
        time.sleep(every)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="use DATABASE_URL's database itself (a Citus cluster's, whose nodes it lists)",
    )
    args = parser.parse_args()
    if args.in_place:
        print(json.dumps(run(os.environ["DATABASE_URL"], args), indent=2))
        return
    scratch = ScratchDatabase(f"bench_children_{os.getpid()}")
    try:
        report = run(scratch.url, args)
    finally:
        scratch.drop()
    print(json.dumps(report, indent=2))


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-children-"))
    config_path = workdir / "children.yaml"
    config_path.write_text(CONFIG)
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "-m", "routemaster", "migrate"], env=env, check=True, capture_output=True
    )
    engine = create_engine(url)
    app = App(config=load_config([config_path]), db=engine)
    order, item = app.config.get_machine("order"), app.config.get_machine("item")
    report: dict[str, Any] = {"items": args.items}
    with engine.connect() as conn:
        report["citus"] = bool(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_extension WHERE extname = 'citus'"
            ).scalar_one()
        )
    log = (workdir / "cron.log").open("w")
    cron = subprocess.Popen(
        [sys.executable, "-m", "routemaster", "-c", str(config_path), "cron"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(3)  # the worker is up and idle
        # 1. Spawning.
        created = time.monotonic()
        big = f"big{os.getpid()}"  # a name of this run's own (--in-place keeps older runs')
        service.create_label(app, order, big, {"items": list(range(args.items))})
        report["parent_row_bytes_before"] = _value(engine, ROW_SIZE, name=big)[0]

        def spawned() -> bool:
            row = _value(engine, SPAWNED, name=big)
            return row is not None and row[0] == row[1] == args.items

        _wait(spawned, timeout=3600, every=0.05)
        seconds = time.monotonic() - created
        report["spawn_seconds"] = round(seconds, 2)
        report["spawn_rate_per_second"] = round(args.items / seconds)
        report["parent_row_bytes_after"] = _value(engine, ROW_SIZE, name=big)[0]
        # 2. The decision after the last of 100,000 children.
        with engine.begin() as conn:
            conn.exec_driver_sql(FINISH_ALL_BUT, {"last": f"{big}/0", "prefix": f"{big}/"})
            conn.exec_driver_sql(RECORD_ALL_BUT, {"last": f"{big}/0", "parent": big})
            conn.exec_driver_sql("ANALYZE children")
        started = time.monotonic()
        with engine.connect() as conn:
            conn.exec_driver_sql(COUNT, {"name": big}).all()
        report["count_100k_ms"] = round((time.monotonic() - started) * 1000, 1)
        time.sleep(1)
        assert _value(engine, STATE, name=big)[0] == "pick"
        service.update_metadata(app, item, f"{big}/0", {"ok": True})
        latency = _wait(lambda: _value(engine, STATE, name=big)[0] == "done", timeout=120)
        report["decision_after_last_child_ms"] = round(latency * 1000, 1)
        report["parent_row_bytes_decided"] = _value(engine, ROW_SIZE, name=big)[0]
        # 3. Small parents: the decision latency, many times.
        latencies = []
        for index in range(args.small):
            name = f"small{os.getpid()}-{index}"
            service.create_label(app, order, name, {"items": list(range(10))})
            _wait(lambda name=name: _children(engine, name) == 10, timeout=60)
            for child in range(9):
                service.update_metadata(app, item, f"{name}/{child}", {"ok": True})
            time.sleep(0.2)
            service.update_metadata(app, item, f"{name}/9", {"ok": True})
            latencies.append(
                _wait(lambda name=name: _value(engine, STATE, name=name)[0] == "done", 60)
            )
        if latencies:
            report["small_parents_decision_ms"] = {
                "count": len(latencies),
                "p50": round(statistics.median(latencies) * 1000, 1),
                "max": round(max(latencies) * 1000, 1),
            }
    finally:
        cron.send_signal(signal.SIGTERM)
        cron.wait(60)
        log.close()
        engine.dispose()
    return report


def _children(engine: sa.Engine, name: str) -> int:
    row = _value(
        engine,
        "SELECT count(*) FROM children WHERE parent_name = %(name)s",
        name=name,
    )
    return int(row[0])


if __name__ == "__main__":
    main()
