"""One PostgreSQL server beside a Citus cluster (a coordinator and its workers) on the same work.

    python bench/citus.py --coordinator postgresql://root@127.0.0.1:9740/routemaster
        [--plain URL] [--seconds 10] [--clients 8] [--processes 2] [--labels 1000]
        [--cron 1] [--targets plain,citus]

``--coordinator`` names a Citus coordinator (a database of it that lists the workers:
``../shared/citus/cluster.sh start`` prints one, ``bench/citus_cluster.sh start N`` starts
one with N workers). Each target gets a database of its own, dropped afterwards:

- ``plain``: a database without the extension, on the ``--plain`` server, by default the
  coordinator's own server (the same PostgreSQL, settings and machine: plain PostgreSQL);
- ``citus``: a database on the coordinator and on every worker node, with the extension and the
  workers added, migrated through the coordinator (``routemaster migrate`` distributes it).

On each, ``routemaster serve --no-worker --workers P`` is measured by ``--clients`` threads over
kept-alive connections for ``--seconds`` each: creates/s (a new label, into a gate), reads/s
(``GET`` of one of them), patches/s (a metadata update, whose first one per label moves it
through the gate); then the webhook drain: ``--labels`` labels created into an action that
calls ``bench/receiver.py``, ``--cron`` ``routemaster cron`` processes started, and the time
until every label has left the action (labels/s). Then pull workers: ``--labels`` labels
created into a ``worker:`` action, claimed one at a time by ``--clients`` threads
(``POST /tasks/claim``) and completed (``POST /tasks/{id}/complete``) until none is
left. Last, ``--idle`` seconds with one ``cron`` running and nothing due. For each
phase it reads the CPU time each database server spent (the coordinator and each worker),
from their postmasters' own and reaped children's times plus the live backends':
milliseconds per operation on each node and on the busiest, and CPU seconds per minute
when idle (docs/performance.md, "Capacity per node").

Prints a table of both targets and the command that made it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pooler import rate  # noqa: E402

from routemaster.db.plumbing.database import create_engine, normalise_url  # noqa: E402
from routemaster.db.upgrade import upgrade  # noqa: E402
from tests.citus_cluster import (  # noqa: E402
    Cluster,
    Node,
    create_cluster_database,
    drop_cluster_database,
    worker_nodes,
)
from tests.serving import free_port, serve_process  # noqa: E402

CONFIG = """
state_machines:
  bench:
    states:
      - gate: start
        triggers:
          - metadata: go
        exit_condition: metadata.go = true
        next: done
      - gate: done
        exit_condition: false
  flow:
    states:
      - action: notify
        webhook: "http://127.0.0.1:{port}/ok"
        next: done
      - gate: done
        exit_condition: false
  pull:
    states:
      - action: work
        worker: {{lease: 5m}}
        next: done
      - gate: done
        exit_condition: false
"""


@dataclass
class Target:
    """A database the service runs on, and the servers whose CPU time counts."""

    name: str
    url: str
    coordinator: Node
    workers: tuple[Node, ...]
    drop: Callable[[], None]


def _postmaster(node: Node, url: sa.URL) -> psutil.Process:
    """The node's postmaster, from its data directory (the server must run on this machine)."""
    engine = sa.create_engine(node.url(url, url.database or "postgres"), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            data = conn.execute(sa.text("SELECT current_setting('data_directory')")).scalar_one()
    finally:
        engine.dispose()
    pid = int((Path(data) / "postmaster.pid").read_text().split()[0])
    return psutil.Process(pid)


def server_cpu(postmaster: psutil.Process) -> float:
    """Seconds of CPU a server has used: its postmaster, its exited (reaped) processes and its
    live ones."""
    times = postmaster.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in postmaster.children():
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += child_times.user + child_times.system
    return float(total)


@contextmanager
def plain_target(server: str, name: str) -> Iterator[Target]:
    url = sa.engine.make_url(normalise_url(server))
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    node = Node(url.host or "127.0.0.1", url.port or 5432)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    target_url = url.set(database=name).render_as_string(hide_password=False)
    try:
        yield Target("plain", target_url, node, (), drop)
    finally:
        drop()
        admin.dispose()


_COORDINATOR_HOLDS_SHARDS = (
    "SELECT citus_set_node_property(%(host)s, %(port)s, 'shouldhaveshards', true)"
)


@contextmanager
def citus_target(
    coordinator: str, name: str, *, coordinator_shards: bool = False
) -> Iterator[Target]:
    database: Cluster = create_cluster_database(name, coordinator)
    try:
        if coordinator_shards:  # before migrate distributes: a third of the shards stay there
            node = database.coordinator
            engine = create_engine(database.url)
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    _COORDINATOR_HOLDS_SHARDS, {"host": node.host, "port": node.port}
                )
            engine.dispose()
        yield Target(
            "citus",
            database.url,
            database.coordinator,
            database.workers,
            lambda: drop_cluster_database(database),
        )
    finally:
        drop_cluster_database(database)


def measure(
    target: Target, args: argparse.Namespace, config: Path, received: Callable[[], int]
) -> dict[str, float]:
    engine = create_engine(target.url)
    upgrade(engine)  # on Citus, distributes
    url = sa.engine.make_url(target.url)
    coordinator = _postmaster(target.coordinator, url)
    workers = [_postmaster(node, url) for node in target.workers]
    results: dict[str, float] = {}

    nodes = [coordinator, *workers]
    node_names = ["coordinator", *(f"worker {n}" for n in range(1, len(workers) + 1))]

    def cpu() -> list[float]:
        return [server_cpu(node) for node in nodes]

    def phase(name: str, run: Callable[[], tuple[float, int]]) -> None:
        before = cpu()
        per_second, count = run()
        after = cpu()
        results[f"{name}/s"] = per_second
        spent = [1000 * (a - b) / max(count, 1) for a, b in zip(after, before, strict=True)]
        for node, ms in zip(node_names, spent, strict=True):
            results[f"{name}: {node} CPU ms"] = ms
        if workers:
            results[f"{name}: busiest node CPU ms"] = max(spent)

    def idle() -> None:
        """CPU per minute on each node with one ``cron`` running and nothing due."""
        with cron_processes(target.url, config, 1):
            time.sleep(args.idle_warmup)
            before, started = cpu(), time.monotonic()
            time.sleep(args.idle)
            after, elapsed = cpu(), time.monotonic() - started
        for node, (a, b) in zip(node_names, zip(after, before, strict=True), strict=True):
            results[f"idle: {node} CPU s/min"] = 60 * (a - b) / elapsed
        if workers:
            results["idle: workers CPU s/min"] = (
                60 * sum(after[1:]) / elapsed - 60 * sum(before[1:]) / elapsed
            )

    prefix = f"b{uuid.uuid4().hex[:6]}"
    env = {"ROUTEMASTER_DIRECT_DATABASE_URL": target.url}
    with serve_process(config, target.url, "--workers", str(args.processes), env=env) as (_, base):
        created = [0] * args.clients

        def create(session: requests.Session, base: str, client: int, i: int) -> int:
            url = f"{base}/state-machines/bench/labels/{prefix}-{client}-{i}"
            status = session.post(url, json={"metadata": {"n": i}}).status_code
            created[client] = i + 1
            return status

        # Reads and patches go round each client's first ten labels (the first patch of each
        # moves it through the gate; later ones only merge metadata).
        def read(session: requests.Session, base: str, client: int, i: int) -> int:
            name = f"{prefix}-{client}-{i % min(10, created[client])}"
            return session.get(f"{base}/state-machines/bench/labels/{name}").status_code

        def patch(session: requests.Session, base: str, client: int, i: int) -> int:
            name = f"{prefix}-{client}-{i % min(10, created[client])}"
            url = f"{base}/state-machines/bench/labels/{name}"
            return session.patch(url, json={"metadata": {"go": True, "i": i}}).status_code

        def timed(request: Callable[..., int]) -> Callable[[], tuple[float, int]]:
            return lambda: rate(base, args.clients, args.seconds, request)

        if "requests" in args.only:
            for name, request in (("creates", create), ("reads", read), ("patches", patch)):
                phase(name, timed(request))

        def create_flow(session: requests.Session, base: str, client: int, i: int) -> int:
            url = f"{base}/state-machines/flow/labels/{prefix}-{client}-{i}"
            return session.post(url, json={"metadata": {}}).status_code

        per_client = -(-args.labels // args.clients)
        if "deliveries" in args.only:
            rate(base, args.clients, None, create_flow, per_client=per_client)
            phase("deliveries", lambda: drain(target.url, config, args.cron, received))

        def create_pull(session: requests.Session, base: str, client: int, i: int) -> int:
            url = f"{base}/state-machines/pull/labels/{prefix}-{client}-{i}"
            return session.post(url, json={"metadata": {}}).status_code

        if "pull" in args.only:
            rate(base, args.clients, None, create_pull, per_client=per_client)
            phase("pull claim+complete", lambda: pull(base, args.clients))
    if args.idle and "idle" in args.only:
        idle()
    engine.dispose()
    return results


@contextmanager
def receiver_at(port: int) -> Iterator[Callable[[], int]]:
    """``bench/receiver.py`` on ``port`` while the block runs; gives its count of calls answered
    200 so far."""
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "receiver.py"), "--port", str(port)]
    )
    try:
        yield lambda: int(requests.get(f"http://127.0.0.1:{port}/stats").json()["ok"])
    finally:
        receiver.terminate()
        receiver.wait()


@contextmanager
def cron_processes(url: str, config: Path, processes: int) -> Iterator[None]:
    """``processes`` ``routemaster cron``, from the moment each has started (its start-up is
    not counted) until the block ends."""
    env = {**os.environ, "DATABASE_URL": url, "ROUTEMASTER_DIRECT_DATABASE_URL": url}
    logs = [
        Path(f"/tmp/routemaster-bench-citus-{os.getpid()}-cron{n}.log") for n in range(processes)
    ]
    crons = []
    try:
        for index, log in enumerate(logs):
            with log.open("wb") as output:
                crons.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "routemaster", "-c", str(config), "cron"],
                        env={**env, "ROUTEMASTER_WORKER_ID": f"bench-{index}"},
                        cwd=ROOT,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                )
        while not all("started" in log.read_text() for log in logs):
            if any(cron.poll() is not None for cron in crons):
                raise SystemExit(f"a cron process ended: {[log.read_text() for log in logs]}")
            time.sleep(0.05)
        yield
        if any(cron.poll() is not None for cron in crons):
            raise SystemExit(f"a cron process ended: {[log.read_text() for log in logs]}")
    finally:
        for cron in crons:
            cron.terminate()
        for cron in crons:
            cron.wait(30)
        for log in logs:
            log.unlink(missing_ok=True)


def drain(
    url: str, config: Path, processes: int, received: Callable[[], int] | None = None
) -> tuple[float, int]:
    """``processes`` ``routemaster cron`` until no label is left in the action: labels/s, and how
    many were delivered, from the moment every cron has started.

    ``received``: the receiver's count of calls. Given, the drain waits on it until every label
    was called, and only then reads the labels left every 50 ms: on Citus that count reads
    every shard, and polled all along it cost each worker about a third of what the
    deliveries themselves cost there."""
    engine = create_engine(url)

    def left() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM labels WHERE state = 'notify'")
                ).scalar_one()
            )

    try:
        # Counted before any cron runs: nothing moves the labels or calls the receiver until then.
        waiting, calls = left(), received() if received is not None else 0
        with cron_processes(url, config, processes):
            started = time.monotonic()
            if received is not None:
                while received() < calls + waiting:
                    time.sleep(0.05)
            while left():
                time.sleep(0.05)
            elapsed = time.monotonic() - started
    finally:
        engine.dispose()
    return waiting / elapsed, waiting


def pull(base: str, clients: int) -> tuple[float, int]:
    """Pull workers (``clients`` threads) claiming one task at a time and completing it, until
    none is left: tasks/s, and how many were completed."""
    done = [0] * clients

    def work(client: int) -> None:
        session = requests.Session()
        while True:
            claim = {"worker": f"bench-{client}", "limit": 1}
            answer = session.post(f"{base}/tasks/claim", json=claim)
            assert answer.status_code == 200, answer.text
            tasks = answer.json()["tasks"]
            if not tasks:
                break
            for task in tasks:
                url = f"{base}/tasks/{task['id']}/complete"
                status = session.post(url, json={"metadata": {"done": True}}).status_code
                assert status == 200, status
                done[client] += 1
        session.close()

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(work, range(clients)))
    return sum(done) / (time.monotonic() - started), sum(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=os.environ.get("ROUTEMASTER_TEST_CITUS_URL"))
    parser.add_argument("--plain", help="a plain server (default: the coordinator's own)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2, help="serve --workers")
    parser.add_argument("--labels", type=int, default=1000, help="labels the cron drains")
    parser.add_argument("--cron", type=int, default=1, help="routemaster cron processes")
    parser.add_argument("--targets", default="plain,citus")
    parser.add_argument(
        "--idle", type=float, default=30.0, help="seconds of idle CPU measured (0: none)"
    )
    parser.add_argument("--idle-warmup", type=float, default=5.0)
    parser.add_argument(
        "--coordinator-shards",
        action="store_true",
        help="the coordinator holds shards too (citus_set_node_property ... shouldhaveshards)",
    )
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        default={"requests", "deliveries", "pull", "idle"},
        help="phases to run, of requests,deliveries,pull,idle (default: all)",
    )
    args = parser.parse_args()
    if not args.coordinator:
        parser.error("--coordinator (or ROUTEMASTER_TEST_CITUS_URL) names no Citus coordinator")
    receiver_port = free_port()
    config = Path(f"/tmp/routemaster-bench-citus-{os.getpid()}.yaml")
    config.write_text(CONFIG.format(port=receiver_port))
    results: dict[str, dict[str, float]] = {}
    with receiver_at(receiver_port) as received:
        for name in args.targets.split(","):
            database = f"bench_citus_{name}_{os.getpid()}"
            if name == "plain":
                made = plain_target(args.plain or args.coordinator, database)
            else:
                made = citus_target(
                    args.coordinator, database, coordinator_shards=args.coordinator_shards
                )
            with made as target:
                results[name] = measure(target, args, config, received)
                for key, value in results[name].items():  # before the database is dropped
                    print(f"{name}: {key}: {value:.2f}", flush=True)
    config.unlink()
    workers = len(worker_nodes(sa.engine.make_url(normalise_url(args.coordinator))))
    print(f"$ python bench/citus.py {shlex.join(sys.argv[1:])}")
    print(
        f"{args.clients} clients, {args.seconds:g} s each; serve --workers {args.processes};"
        f" {args.labels} labels drained by {args.cron} cron; Citus: coordinator + {workers} workers"
    )
    names = list(results)
    print(f"{'':34}" + "".join(f"{name:>12}" for name in names))
    for key in results[names[-1]] | results[names[0]]:
        cells = "".join(
            f"{results[name][key]:>12.2f}" if key in results[name] else f"{'':>12}"
            for name in names
        )
        print(f"{key:34}{cells}")


if __name__ == "__main__":
    main()
