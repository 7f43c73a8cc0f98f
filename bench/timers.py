"""Waiting costs nothing (issue 28, SPEC E1): a million labels in a timed gate, one ``cron``.

    .venv/bin/python bench/timers.py [--labels 1000000] [--movable 10000] [--occurrences 3]
        [--timer 10000] [--private-server]

In a scratch database (``DATABASE_URL``'s server; with ``--private-server`` a
PostgreSQL cluster of its own in a temporary directory, so the WAL it counts
is this benchmark's alone):

1. ``--labels`` labels are inserted straight into a gate ``interval: 1m`` with
   ``12h has passed since history.entered_state``, entered in the last ten
   minutes, as rows of an older release would be: without next checks.
   ``migrate -c`` then computes every next check (timed), while a thread
   reads labels through ``serve --no-worker`` (latency measured).
2. One ``cron`` runs for ``--occurrences`` occurrences of the interval with
   nothing else happening. Per occurrence: the worker's CPU, the CPU of the
   database backends serving this database, WAL written (the whole server:
   use ``--private-server`` for this benchmark's alone), row writes to
   ``labels`` and ``history``, statement timeouts. Then as many occurrences
   again while a client PATCHes random waiting labels, 20 a second (p50/p99).
3. Then ``--movable`` more labels are inserted (again without next checks:
   the running worker computes them) that entered 12 h minus 1 to
   ``--occurrences`` minutes ago, so they become movable during the next
   occurrences, while the client goes on PATCHing. Each movable label must
   move at the first occurrence at or after its condition first held (as
   evaluating every label at every occurrence would): the report counts
   exact, early, late and missed ones.
3. ``--timer`` labels in an ``event: timer`` gate whose condition
   (``system.now >= metadata.send_at``) first holds at moments spread over
   one minute: how long after its moment each moved (p50/p99/max), and the
   worker's CPU in the idle stretch before the first moment.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scratch import ScratchDatabase  # noqa: E402

CONFIG = """
state_machines:
  drip:
    states:
      - gate: waiting
        triggers:
          - interval: 1m
        exit_condition: 12h has passed since history.entered_state
        next: sent
      - gate: sent
        exit_condition: false
  timer:
    states:
      - gate: waiting
        triggers:
          - event: timer
        exit_condition: system.now >= metadata.send_at
        next: sent
      - gate: sent
        exit_condition: false
"""

INSERT_LABELS = """
    WITH wanted AS (
        SELECT g, nextval(pg_get_serial_sequence('history', 'id')) AS id,
               now() - %(back)s * interval '1 second'
                     + random() * %(spread)s * interval '1 second' AS at
        FROM generate_series(%(first)s, %(last)s) AS g
    ), entries AS (
        INSERT INTO history (id, state_machine, label, old_state, new_state, created, shard_key)
        SELECT id, 'drip', %(prefix)s || g, NULL, 'waiting', at,
               routemaster_shard_key(%(prefix)s || g)
        FROM wanted
    )
    INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                        created_at, updated_at, name_key, shard_key)
    SELECT 'drip', %(prefix)s || g, '{}', 'waiting', at, id, at, at,
           routemaster_label_key(%(prefix)s || g), routemaster_shard_key(%(prefix)s || g)
    FROM wanted
"""

TABLE_WRITES = """
    SELECT COALESCE(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables
    WHERE relname IN ('labels', 'history')
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--movable", type=int, default=10_000)
    parser.add_argument("--occurrences", type=int, default=3)
    parser.add_argument("--timer", type=int, default=10_000)
    parser.add_argument("--private-server", action="store_true")
    args = parser.parse_args()
    with _server(args.private_server) as server:
        os.environ["DATABASE_URL"] = server
        scratch = ScratchDatabase(f"bench_timers_{os.getpid()}")
        try:
            report = run(scratch.url, args)
        finally:
            scratch.drop()
    print(json.dumps(report, indent=2))


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench_timers_"))
    config = workdir / "timers.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "DATABASE_URL": url}
    cli = [sys.executable, "-m", "routemaster", "-c", str(config)]
    subprocess.run(
        [sys.executable, "-m", "routemaster", "migrate"], env=env, check=True, capture_output=True
    )
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    report: dict[str, Any] = {"labels": args.labels}
    started = time.monotonic()
    step = 100_000
    with engine.begin() as conn:
        for first in range(1, args.labels + 1, step):
            last = min(first + step - 1, args.labels)
            waiting = {"back": 600, "spread": 600, "prefix": "user-"}
            conn.exec_driver_sql(INSERT_LABELS, {"first": first, "last": last, **waiting})
        conn.exec_driver_sql("ANALYZE labels")
    report["insert_seconds"] = round(time.monotonic() - started, 1)
    port = _free_port()
    api = subprocess.Popen(
        [*cli, "serve", "--no-worker", "-b", f"127.0.0.1:{port}", "--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{base}/")
        with _latency(base, "user-", args.labels, patch=False) as during_migrate:
            started = time.monotonic()
            migrate = subprocess.run(
                [*cli, "migrate"], env=env, check=True, capture_output=True, text=True
            )
            report["migrate_next_checks"] = {
                "seconds": round(time.monotonic() - started, 1),
                "output": migrate.stderr.strip().splitlines()[-2:],
            }
        report["migrate_next_checks"]["api_get_ms"] = during_migrate.summary()
        report["occurrences"] = _occurrences(engine, cli, env, base, args, workdir)
        print(json.dumps(report, indent=2), file=sys.stderr)  # kept if a later phase fails
        stopped_at = report["occurrences"]["stopped_at"]
        report["movable"] = _movable_check(engine, args.movable, stopped_at)
        if args.timer:
            report["timer"] = _timer(engine, cli, env, args.timer, workdir)
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(30)
        engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _occurrences(
    engine: sa.Engine,
    cli: list[str],
    env: dict[str, str],
    base: str,
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, Any]:
    """One cron for ``--occurrences`` intervals: what each occurrence cost."""
    log = workdir / "cron.log"
    with log.open("w") as out:
        cron = subprocess.Popen([*cli, "cron"], env=env, stdout=out, stderr=subprocess.STDOUT)
    samples = []
    try:
        # Start between occurrences; sample just before each next one and just after.
        _sleep_until_second(50)
        before = _sample(engine, cron.pid)
        for _ in range(args.occurrences):
            _sleep_until_second(50)  # an occurrence (at :00) passes in between
            after = _sample(engine, cron.pid)
            samples.append(_difference(before, after))
            before = after
        # PATCHes of waiting labels while occurrences come and go, nothing else moving.
        with _latency(base, "user-", args.labels, patch=True) as quiet_patches:
            for _ in range(args.occurrences):
                _sleep_until_second(50)
        # Labels that become movable over the next occurrences, entered 12 h ago less a bit.
        movable = {
            "first": 1,
            "last": args.movable,
            "back": 12 * 3600 - 60,
            "spread": 60 * args.occurrences,
            "prefix": "movable-",
        }
        with engine.begin() as conn:
            conn.exec_driver_sql(INSERT_LABELS, movable)
        with _latency(base, "user-", args.labels, patch=True) as patches:
            for _ in range(args.occurrences + 1):
                _sleep_until_second(50)
    finally:
        cron.send_signal(signal.SIGTERM)
        cron.wait(60)
    text = log.read_text()
    return {
        "stopped_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "per_occurrence_waiting_only": samples,
        "patch_ms_during_occurrences": quiet_patches.summary(),
        "fired": text.count("fired for"),
        "statement_timeouts": text.count("statement timeout"),
        "database_unavailable": text.count("database unavailable"),
        "patch_ms_while_labels_move": patches.summary(),
    }


def _movable_check(engine: sa.Engine, movable: int, stopped_at: str) -> dict[str, Any]:
    """Each movable label moved at the first 1-minute occurrence at or after entry + 12 h.

    A label whose occurrence came before the worker stopped and that did not move is missed.
    """
    stopped = datetime.datetime.fromisoformat(stopped_at)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """
            SELECT entered.created, moved.created FROM history AS entered
            LEFT JOIN history AS moved ON moved.state_machine = entered.state_machine
                AND moved.label = entered.label AND moved.old_state = 'waiting'
            WHERE entered.state_machine = 'drip' AND entered.old_state IS NULL
              AND entered.label LIKE 'movable-%%'
            """,
        ).all()
    exact = early = late = missed = 0
    lateness = []
    for entered, moved in rows:
        holds = entered + datetime.timedelta(hours=12)
        occurrence = _ceil_minute(holds)
        if moved is None:
            missed += occurrence < stopped - datetime.timedelta(seconds=5)
            continue
        if moved < holds or moved < occurrence:
            early += 1
        elif moved >= occurrence + datetime.timedelta(minutes=1):
            late += 1
        else:
            exact += 1
            lateness.append((moved - occurrence).total_seconds())
    return {
        "inserted": movable,
        "moved": sum(moved is not None for _, moved in rows),
        "missed": missed,
        "at_their_occurrence": exact,
        "early": early,
        "late": late,
        "seconds_after_occurrence": _summary([x * 1000 for x in lateness], "ms"),
    }


def _timer(
    engine: sa.Engine, cli: list[str], env: dict[str, str], count: int, workdir: Path
) -> dict[str, Any]:
    """``event: timer``: labels whose moments fall within one minute move within a second."""
    port = _free_port()
    log = workdir / "timer-cron.log"
    with log.open("w") as out:
        cron = subprocess.Popen([*cli, "cron"], env=env, stdout=out, stderr=subprocess.STDOUT)
    api = subprocess.Popen(
        [*cli, "serve", "--no-worker", "-b", f"127.0.0.1:{port}", "--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{base}/")
        start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=90)
        moments = {}
        for i in range(count):  # created through the API, as a client would
            moment = start + datetime.timedelta(seconds=60 * random.random())
            moments[f"t{i}"] = moment
            _request(
                "POST",
                f"{base}/state-machines/timer/labels/t{i}",
                {"metadata": {"send_at": moment.isoformat()}},
            )
        idle_before = _cpu_seconds(cron.pid)
        wait = (start - datetime.datetime.now(datetime.UTC)).total_seconds() - 1
        time.sleep(max(wait, 0))
        idle_cpu = _cpu_seconds(cron.pid) - idle_before
        idle_span = max(wait, 0)
        time.sleep(62)
    finally:
        cron.send_signal(signal.SIGTERM)
        cron.wait(60)
        api.send_signal(signal.SIGTERM)
        api.wait(30)
    with engine.connect() as conn:
        moved = dict(
            conn.exec_driver_sql(
                "SELECT label, created FROM history WHERE state_machine = 'timer'"
                " AND old_state = 'waiting'"
            ).all()
        )
    delays = [(moved[name] - moments[name]).total_seconds() * 1000 for name in moved]
    return {
        "labels": count,
        "moved": len(moved),
        "early": sum(delay < 0 for delay in delays),
        "ms_after_moment": _summary(delays, "ms"),
        "worker_cpu_while_waiting": f"{idle_cpu:.2f} s over {idle_span:.0f} s",
    }


class _Latencies:
    def __init__(self) -> None:
        self.values: list[float] = []
        self.errors = 0

    def summary(self) -> dict[str, Any]:
        summary = _summary(self.values, "ms")
        summary["errors"] = self.errors
        return summary


@contextmanager
def _latency(base: str, prefix: str, labels: int, *, patch: bool) -> Iterator[_Latencies]:
    """A client reading (or updating) random waiting labels, 20 a second, timed."""
    result = _Latencies()
    stop = threading.Event()

    def load() -> None:
        counter = 0
        while not stop.is_set():
            name = f"{prefix}{random.randint(1, labels)}"
            url = f"{base}/state-machines/drip/labels/{name}"
            started = time.perf_counter()
            try:
                if patch:
                    counter += 1
                    _request("PATCH", url, {"metadata": {"seen": counter}})
                else:
                    _request("GET", url)
                result.values.append((time.perf_counter() - started) * 1000)
            except Exception:
                result.errors += 1
            stop.wait(0.05)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()


def _sample(engine: sa.Engine, cron_pid: int) -> dict[str, float]:
    with engine.connect() as conn:
        backends = [
            row[0]
            for row in conn.exec_driver_sql(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ]
        wal = conn.exec_driver_sql(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
        ).scalar_one()
        writes = conn.exec_driver_sql(TABLE_WRITES).scalar_one()
    return {
        "worker_cpu": _cpu_seconds(cron_pid),
        "db_cpu": sum(_cpu_seconds(pid) for pid in backends),
        "wal": float(wal),
        "writes": float(writes),
        "at": time.time(),
    }


def _difference(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    return {
        "seconds": round(after["at"] - before["at"], 1),
        "worker_cpu_s": round(after["worker_cpu"] - before["worker_cpu"], 3),
        "database_cpu_s": round(max(after["db_cpu"] - before["db_cpu"], 0.0), 3),
        "wal_mib": round((after["wal"] - before["wal"]) / 2**20, 2),
        "rows_written": int(after["writes"] - before["writes"]),
    }


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(values: list[float], unit: str) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        f"p50_{unit}": round(statistics.median(ordered), 1),
        f"p99_{unit}": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        f"max_{unit}": round(ordered[-1], 1),
    }


def _ceil_minute(moment: datetime.datetime) -> datetime.datetime:
    floor = moment.replace(second=0, microsecond=0)
    return floor if floor == moment else floor + datetime.timedelta(minutes=1)


def _sleep_until_second(second: int) -> None:
    now = time.time()
    target = now - now % 60 + second
    if target <= now:
        target += 60
    time.sleep(target - now)


def _request(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _wait_for(url: str) -> None:
    deadline = time.monotonic() + 300  # serve migrates and checks the labels at start
    while time.monotonic() < deadline:
        try:
            _request("GET", url)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} never answered")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _server(private: bool) -> Iterator[str]:
    """``DATABASE_URL``'s server, or a private cluster (initdb as ``postgres``) on a free port."""
    if not private:
        yield os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
        return
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    data = Path(tempfile.mkdtemp(prefix="bench_timers_pg_"))
    shutil.chown(data, "postgres")
    port = _free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_postgres, str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_postgres,
            str(binaries / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(data / "log"),
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_postgres, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
