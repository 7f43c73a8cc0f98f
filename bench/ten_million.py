"""Nothing grows with what waits (SPEC F2, issue 36): what a service costs with N labels stored.

    .venv/bin/python bench/ten_million.py [--labels 1000000] [--paused 100000]
        [--idle-seconds 120] [--scrape-every 15] [--repo PATH]

On a private PostgreSQL (``initdb`` and ``pg_ctl`` in a temporary directory,
on a free port, removed afterwards):

1. ``migrate -c`` with the example machine (``order``, example.yaml) and a
   drip gate, then ``--labels`` labels and their history rows written
   straight into the tables with ``generate_series``, in batches of
   :data:`BATCH` (each label carries ``routemaster_shard_key(name)``, as the
   service writes it), spread over the gates that wait on nothing timed, and
   ``--paused`` paused labels whose time has passed (``due_at`` an hour ago).
   Then ``VACUUM ANALYZE``, as autovacuum would have done by then. The fill
   is timed.
2. ``serve --no-worker`` and one ``cron`` started: seconds until each answers
   (the API's ``GET /state-machines``, the worker's metrics endpoint).
3. Timed requests (median and worst of :data:`REPEATS`): a ``/metrics``
   scrape (5.5 s apart: the label gauges are cached for 5 s), the console's
   machine page, ``GET /state-machines/order``, ``GET /receivers``; and
   ``routemaster plan`` as an operator runs it (a new process each time,
   Python's start-up included).
4. ``--idle-seconds`` with nothing else happening but a ``/metrics`` scrape
   every ``--scrape-every`` seconds (0: none): the CPU of every PostgreSQL
   process (``/proc``), and the rows of ``labels`` read per minute
   (``pg_stat_user_tables``: ``seq_tup_read + idx_tup_fetch``).

``--repo`` runs another checkout's ``routemaster`` (a baseline: ``git
archive main | tar -x -C /tmp/base``) with this script and this virtualenv.
Prints one table (and the figures as JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]

BATCH = 250_000
"""Labels written per statement while filling."""

REPEATS = 5

GAUGES_INTERVAL = 5.0
"""``ROUTEMASTER_LABEL_GAUGES_INTERVAL``'s default: /metrics counts labels at most this often."""

DRIP = """
  drip:
    states:
      - gate: waiting
        triggers:
          - interval: 1m
        exit_condition: 12h has passed since history.entered_state
        next: sent
      - gate: sent
        exit_condition: false
"""

# (machine, state) the filled labels sit in, in turn: gates whose next check is none
# (nothing timed in their exit conditions), so no worker has anything to do for them.
SPREAD = (
    ("order", "awaiting_payment"),
    ("order", "checking_stock"),
    ("order", "awaiting_delivery"),
    ("order", "done"),
    ("drip", "sent"),
)

# One batch: history rows (the label's creation) and the labels entering there, scheduled
# (``scheduled_at = updated_at``: the worker has nothing to compute) and due never, unless
# ``paused``: then paused, and due an hour ago.
FILL = """
    WITH spread AS (
        SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[]))
            WITH ORDINALITY AS s (machine, state, n)
    ), wanted AS (
        SELECT %(prefix)s || g AS name, spread.machine, spread.state,
               nextval(pg_get_serial_sequence('history', 'id')) AS id,
               now() - interval '1 day' + g * interval '1 millisecond' AS at
        FROM generate_series(%(first)s, %(last)s) AS g
        JOIN spread ON spread.n = g %% %(kinds)s + 1
    ), entries AS (
        INSERT INTO history (id, state_machine, label, old_state, new_state, created, shard_key)
        SELECT id, machine, name, NULL, state, at, routemaster_shard_key(name) FROM wanted
    )
    INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                        created_at, updated_at, scheduled_at, paused, due_at, name_key,
                        shard_key)
    SELECT machine, name, '{}', state, at, id, at, at, at, %(paused)s,
           CASE WHEN %(paused)s THEN now() - interval '1 hour' END,
           routemaster_label_key(name), routemaster_shard_key(name)
    FROM wanted
"""

# ``plan``'s reads and the start-up check (``record_configuration``: the stranded check, then
# each machine's version recorded, unchanged) timed in one process of the checkout: their
# database part alone, without Python's start-up (which a loaded machine makes seconds).
IN_PROCESS = """
import json, sys, time
from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.plumbing.database import create_engine
from routemaster.service.configuration import current_plan, record_configuration
app = App(config=load_config([sys.argv[1]]), db=create_engine(sys.argv[2], pool_size=2))
found = {}
for name, action in (("plan", current_plan), ("check", record_configuration)):
    action(app)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        action(app)
        times.append((time.perf_counter() - started) * 1000)
    found[name] = {"median": round(sorted(times)[2], 1), "max": round(max(times), 1)}
print(json.dumps(found))
"""

LABELS_READ = """
    SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables
    WHERE relname = 'labels'
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--paused", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=int, default=120)
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to run")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    with _private_server() as (server, postmaster):
        figures = run(server, postmaster, args)
    _print_table(figures, args)
    if args.json:
        print(json.dumps(figures, indent=2))


def run(server: str, postmaster: Path, args: argparse.Namespace) -> dict[str, Any]:
    url = str(sa.engine.make_url(server).set(database="routemaster"))
    driver = sa.engine.make_url(server).set(drivername="postgresql+psycopg2")
    admin = sa.create_engine(driver, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE routemaster")
    admin.dispose()
    workdir = Path(tempfile.mkdtemp(prefix="bench_ten_million_"))
    config = workdir / "config.yaml"
    config.write_text(
        (REPO / "example.yaml").read_text().replace("\nplugins:", DRIP + "\nplugins:")
    )
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONPATH": str(args.repo),
        "ROUTEMASTER_DIRECT_DATABASE_URL": url,
    }
    command = [sys.executable, "-m", "routemaster", "-c", str(config)]
    figures: dict[str, Any] = {"labels": args.labels, "paused": args.paused}
    subprocess.run([*command, "migrate"], env=env, cwd=args.repo, check=True, capture_output=True)
    engine = sa.create_engine(driver.set(database="routemaster"), poolclass=sa.pool.NullPool)
    try:
        figures["fill_s"] = _fill(engine, args.labels, args.paused)
        # The fill wrote labels by SQL: the kept counts are seeded again, as a user who loads
        # labels outside routemaster does (a tree before the kept counts has no --recount).
        started = time.monotonic()
        recount = subprocess.run(
            [*command, "migrate", "--recount"], env=env, cwd=args.repo, capture_output=True
        )
        if recount.returncode == 0:
            figures["recount_s"] = round(time.monotonic() - started, 2)
        api_port, worker_port = _free_port(), _free_port()
        logs = [open(workdir / name, "w") for name in ("serve.log", "cron.log")]  # noqa: SIM115
        started = time.monotonic()
        serve = subprocess.Popen(
            [*command, "serve", "--no-worker", "-b", f"127.0.0.1:{api_port}"],
            env=env,
            cwd=args.repo,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{api_port}"
        try:
            _wait_for(f"{base}/state-machines")
            figures["serve_start_s"] = round(time.monotonic() - started, 2)
            started = time.monotonic()
            cron = subprocess.Popen(
                [*command, "cron", "--metrics-bind", f"127.0.0.1:{worker_port}"],
                env=env,
                cwd=args.repo,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_for(f"http://127.0.0.1:{worker_port}/metrics")
                figures["cron_start_s"] = round(time.monotonic() - started, 2)
                for name, path, pause in (
                    # the label gauges are counted at most every 5 s: each scrape after that
                    ("metrics_ms", "/metrics", GAUGES_INTERVAL + 0.5),
                    ("console_machine_ms", "/console/machines/order", 0.0),
                    ("machine_description_ms", "/state-machines/order", 0.0),
                    ("receivers_ms", "/receivers", 0.0),
                ):
                    figures[name] = _timed(lambda path=path: _get(base + path), pause=pause)
                figures["plan_ms"] = _timed(
                    lambda: subprocess.run(
                        [*command, "plan"], env=env, cwd=args.repo, capture_output=True, check=True
                    ),
                    repeats=3,
                )
                in_process = subprocess.run(
                    [sys.executable, "-c", IN_PROCESS, str(config), url],
                    env=env,
                    cwd=args.repo,
                    capture_output=True,
                    check=True,
                    text=True,
                )
                timed_here = json.loads(in_process.stdout.splitlines()[-1])
                figures["plan_reads_ms"] = timed_here["plan"]
                figures["start_check_ms"] = timed_here["check"]
                figures.update(_idle(engine, postmaster, base, args))
            finally:
                _stop(cron)
        finally:
            _stop(serve)
            for log in logs:
                log.close()
    finally:
        engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)
    return figures


def _fill(engine: sa.Engine, labels: int, paused: int) -> float:
    """Seconds to write the labels, the paused ones, and VACUUM ANALYZE."""
    started = time.monotonic()
    machines = [machine for machine, _ in SPREAD]
    states = [state for _, state in SPREAD]
    for prefix, total, is_paused, spread in (
        ("label-", labels, False, (machines, states)),
        ("paused-", paused, True, (["order"], ["awaiting_payment"])),
    ):
        for first in range(0, total, BATCH):
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    FILL,
                    {
                        "prefix": prefix,
                        "first": first,
                        "last": min(first + BATCH, total) - 1,
                        "machines": spread[0],
                        "states": spread[1],
                        "kinds": len(spread[0]),
                        "paused": is_paused,
                    },
                )
            print(f"filled {prefix}: {min(first + BATCH, total)}", file=sys.stderr)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM (ANALYZE) labels, history")
    return round(time.monotonic() - started, 1)


def _idle(
    engine: sa.Engine, postmaster: Path, base: str, args: argparse.Namespace
) -> dict[str, Any]:
    """PostgreSQL's CPU and the rows of ``labels`` read while the service idles."""
    time.sleep(2)  # the statistics of what came before are flushed (at most every second)
    cpu_before, read_before = _postgres_cpu(postmaster), _labels_read(engine)
    started = time.monotonic()
    scrapes = 0
    while time.monotonic() - started < args.idle_seconds:
        if args.scrape_every > 0:
            _get(f"{base}/metrics")
            scrapes += 1
            time.sleep(
                max(0.0, min(args.scrape_every, args.idle_seconds - (time.monotonic() - started)))
            )
        else:
            time.sleep(args.idle_seconds)
    seconds = time.monotonic() - started
    time.sleep(2)
    cpu_after, read_after = _postgres_cpu(postmaster), _labels_read(engine)
    return {
        "idle_s": round(seconds, 1),
        "idle_scrapes": scrapes,
        "idle_postgres_cpu_percent": round(100 * (cpu_after - cpu_before) / seconds, 1),
        "idle_labels_read_per_minute": round((read_after - read_before) * 60 / seconds),
    }


def _labels_read(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
        return int(conn.exec_driver_sql(LABELS_READ).scalar_one())


def _postgres_cpu(postmaster: Path) -> float:
    """CPU seconds of the postmaster and every process it started (live ones)."""
    root = int(postmaster.read_text().split()[0])
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        pid, parent = int(stat.parent.name), int(fields[1])
        if pid == root or parent == root:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _timed(
    action: Callable[[], object], repeats: int = REPEATS, pause: float = 0.0
) -> dict[str, float]:
    """Median and worst milliseconds of ``repeats`` runs (after one untimed run), ``pause``
    seconds apart."""
    action()
    times = []
    for _ in range(repeats):
        time.sleep(pause)
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return {"median": round(statistics.median(times), 1), "max": round(max(times), 1)}


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return bytes(response.read())


def _wait_for(url: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _private_server() -> Iterator[tuple[str, Path]]:
    """A PostgreSQL cluster of its own (initdb as ``postgres``) on a free port: its URL and
    its ``postmaster.pid``."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    data = Path(tempfile.mkdtemp(prefix="bench_ten_million_pg_"))
    shutil.chown(data, "postgres")
    port = _free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_postgres, str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=200"
    options += " -c max_wal_size=8GB"  # no checkpoint forced in the middle of the fill
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
            options,
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", data / "postmaster.pid"
    finally:
        subprocess.run(
            [*as_postgres, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)


def _print_table(figures: dict[str, Any], args: argparse.Namespace) -> None:
    def timed(name: str) -> str:
        found = figures.get(name)
        return f"{found['median']} ms (worst {found['max']})" if found else "-"

    rows = [
        ("labels (paused overdue)", f"{figures['labels']:,} ({figures['paused']:,})"),
        ("fill, VACUUM ANALYZE included", f"{figures.get('fill_s', '-')} s"),
        ("migrate --recount (seeding the kept counts)", f"{figures.get('recount_s', '-')} s"),
        ("serve start", f"{figures.get('serve_start_s', '-')} s"),
        ("cron start", f"{figures.get('cron_start_s', '-')} s"),
        ("/metrics scrape", timed("metrics_ms")),
        ("console machine page", timed("console_machine_ms")),
        ("GET /state-machines/order", timed("machine_description_ms")),
        ("GET /receivers", timed("receivers_ms")),
        ("routemaster plan (a new process)", timed("plan_ms")),
        ("plan's reads (in one process)", timed("plan_reads_ms")),
        ("start-up check (record_configuration)", timed("start_check_ms")),
        (
            f"idle PostgreSQL CPU ({figures.get('idle_s')} s,"
            f" {figures.get('idle_scrapes')} scrapes)",
            f"{figures.get('idle_postgres_cpu_percent', '-')}% of a core",
        ),
        (
            "labels rows read per idle minute",
            f"{figures.get('idle_labels_read_per_minute', '-'):,}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'what'.ljust(width)} | {args.repo} |")
    print(f"|{'-' * (width + 2)}|---|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
