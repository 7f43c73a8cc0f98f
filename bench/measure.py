"""Measuring tools shared by every scenario: the database server, wrk, pgbench, RSS sampling."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg2
import psycopg2.extensions

BENCH_DIR = Path(__file__).resolve().parent
LUA = BENCH_DIR / "lua" / "bench.lua"


@dataclass(frozen=True)
class Server:
    """The local PostgreSQL server every target's database lives on."""

    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    password: str = ""

    @classmethod
    def from_environment(cls) -> Server:
        """``DATABASE_URL`` names the server (its database name is ignored); else 127.0.0.1."""
        url = os.environ.get("DATABASE_URL")
        if not url:
            return cls()
        parts = urlsplit(url.replace("postgresql+psycopg2://", "postgresql://"))
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password or "",
        )

    def url(self, database: str) -> str:
        auth = self.user + (f":{self.password}" if self.password else "")
        return f"postgresql://{auth}@{self.host}:{self.port}/{database}"

    def connect(self, database: str) -> psycopg2.extensions.connection:
        conn = psycopg2.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password or None,
            dbname=database,
        )
        conn.autocommit = True
        return conn

    def admin(self, *statements: str) -> Any:
        """Run statements outside any transaction (``with conn`` would open one)."""
        conn = self.connect("postgres")
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                return cur.fetchone()[0] if cur.description else None
        finally:
            conn.close()

    def recreate(self, database: str) -> None:
        self.admin(
            f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)', f'CREATE DATABASE "{database}"'
        )

    def drop(self, database: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')

    def version(self) -> str:
        return str(self.admin("SHOW server_version"))

    def libpq_env(self) -> dict[str, str]:
        env = {"PGHOST": self.host, "PGPORT": str(self.port), "PGUSER": self.user}
        if self.password:
            env["PGPASSWORD"] = self.password
        return env


def _wrk_command(
    base_url: str,
    *,
    mode: str,
    machine: str,
    prefix: str,
    n: int,
    connections: int,
    duration: float,
    key: str,
    timeout_s: float,
) -> list[str]:
    threads = 1 if connections < 2 else 2
    return [
        "wrk",
        "-t",
        str(threads),
        "-c",
        str(connections),
        "-d",
        f"{max(1, round(duration))}s",
        "--timeout",
        f"{int(timeout_s)}s",
        "-s",
        str(LUA),
        base_url,
        "--",
        mode,
        machine,
        prefix,
        str(n),
        str(threads),
        key,
    ]


def _wrk_result(stdout: str, stderr: str) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith("BENCHJSON "):
            result: dict[str, Any] = json.loads(line[len("BENCHJSON ") :])
            seconds = result["duration_us"] / 1e6
            result["rate"] = result["requests"] / seconds if seconds else 0.0
            result["errors"] = sum(
                result[k]
                for k in (
                    "status_errors",
                    "connect_errors",
                    "read_errors",
                    "write_errors",
                    "timeouts",
                )
            )
            return result
    raise RuntimeError(f"wrk failed: {stdout}\n{stderr}")


def run_wrk(
    base_url: str,
    *,
    mode: str,
    machine: str,
    prefix: str,
    n: int,
    connections: int,
    duration: float,
    key: str = "go",
    timeout_s: float = 10,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One wrk run for a fixed time; its summary (requests, errors, latency) and the rate."""
    command = _wrk_command(
        base_url,
        mode=mode,
        machine=machine,
        prefix=prefix,
        n=n,
        connections=connections,
        duration=duration,
        key=key,
        timeout_s=timeout_s,
    )
    out = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})}
    )
    return _wrk_result(out.stdout, out.stderr)


def run_wrk_until(
    base_url: str,
    *,
    done: Callable[[], bool],
    cap: float,
    mode: str,
    machine: str,
    prefix: str,
    n: int,
    connections: int,
    key: str = "go",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """wrk until ``done()`` holds (polled), then SIGINT, which makes wrk report and exit.

    wrk's own clock always runs the full ``-d``, even when the script has
    stopped every thread, hence the poll.
    """
    command = _wrk_command(
        base_url,
        mode=mode,
        machine=machine,
        prefix=prefix,
        n=n,
        connections=connections,
        duration=cap,
        key=key,
        timeout_s=10,
    )
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    deadline = time.time() + cap
    while proc.poll() is None and time.time() < deadline and not done():
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate()
    return _wrk_result(stdout, stderr)


def run_pgbench(
    server: Server,
    database: str,
    script: Path,
    *,
    clients: int,
    duration: float,
    defines: dict[str, str] | None = None,
) -> float:
    """Transactions per second of ``script`` (prepared statements: PostgreSQL's ceiling)."""
    command = [
        "pgbench",
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(max(1, round(duration))),
        "-f",
        str(script),
    ]
    for name, value in (defines or {}).items():
        command += ["-D", f"{name}={value}"]
    command.append(database)
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **server.libpq_env()},
    )
    for line in out.stdout.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise RuntimeError(f"pgbench failed: {out.stdout}\n{out.stderr}")


def summarise(values: Iterable[float]) -> dict[str, Any]:
    """Median, min, max and the raw runs."""
    runs = [float(v) for v in values]
    if not runs:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs), "runs": runs}


@dataclass
class MemorySampler:
    """Samples the RSS of every process of the running targets in a background thread.

    ``roots`` maps a target name to a callable giving its root pids with a role
    name each; every descendant is sampled too, named after its root's role.
    Peaks are kept per scenario (``take``) and overall.
    """

    interval: float = 0.2
    roots: dict[str, Callable[[], list[tuple[str, int]]]] = field(default_factory=dict)
    _peaks: dict[str, dict[str, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True, name="rss-sampler").start()

    def stop(self) -> None:
        self._stop.set()

    def take(self) -> dict[str, dict[str, int]]:
        """Peak RSS (bytes) per target and process role since the last call."""
        self.sample()
        with self._lock:
            peaks, self._peaks = self._peaks, {}
        return peaks

    def sample(self) -> None:
        for target, get_roots in list(self.roots.items()):
            for role, pid in get_roots():
                try:
                    root = psutil.Process(pid)
                    procs = [(role, root)] + [
                        (f"{role} child", child) for child in root.children(recursive=True)
                    ]
                except psutil.Error:
                    continue
                for name, proc in procs:
                    try:
                        rss = proc.memory_info().rss
                    except psutil.Error:
                        continue
                    with self._lock:
                        per_target = self._peaks.setdefault(target, {})
                        per_target[name] = max(per_target.get(name, 0), rss)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)
