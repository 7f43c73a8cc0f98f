"""The two services under test, each on its own fresh database and port.

Both are driven through the same HTTP API and the same bench.yaml; what
differs is how each is started and its table layout, which the bulk loaders
(labels written straight into the target's own schema) and the progress
queries (counting history rows) need to know.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg2.extensions
from measure import BENCH_DIR, Server
from psycopg2.extras import Json

REPO = BENCH_DIR.parent
CONFIG = BENCH_DIR / "bench.yaml"
SECURED = BENCH_DIR / "bench-secured.yaml"
VARIANTS = ("project", "plain", "secured")
"""The project as deployed by default (metrics on, no tokens), with metrics off, with tokens on."""
REFERENCE_VENV = BENCH_DIR / ".venv-reference"
# Each run's databases carry its process id: runs by several people on one
# server must not drop each other's databases.
RUN_SUFFIX = f"_{os.getpid()}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Target:
    """A service under test: started as processes, talking to database ``self.database``."""

    name: str
    database: str
    history_machine_column: str

    def __init__(self, server: Server, log_dir: Path) -> None:
        self.server = server
        self.log_dir = log_dir
        self.cwd = REPO
        self.port = free_port()  # not a fixed one: another run on this host may hold it
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.started_at = 0.0
        self._conn: psycopg2.extensions.connection | None = None
        self.auth_headers: dict[str, str] = {}  # sent with every request
        self.wrk_env: dict[str, str] = {}  # bench.lua reads ROUTEMASTER_BENCH_TOKEN

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------

    def fresh_database(self) -> None:
        self.stop()
        self.close()
        self.server.recreate(self.database)
        self.create_schema()

    def create_schema(self) -> None:
        raise NotImplementedError

    def commands(self) -> list[tuple[str, list[str], dict[str, str]]]:
        """(role, argv, extra environment) of every process of the target."""
        raise NotImplementedError

    def start(self) -> None:
        for role, argv, env in self.commands():
            log = open(self.log_dir / f"{self.name}-{role}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.procs.append((role, proc))
        self.started_at = time.time()
        self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for role, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} {role} exited with {proc.returncode}; "
                        f"see {self.log_dir}/{self.name}-{role}.log"
                    )
            try:
                with urllib.request.urlopen(self.base_url + "/", timeout=2) as response:
                    if response.status == 200:
                        time.sleep(1)  # let the other workers and the cron finish booting
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer on {self.base_url} within {timeout}s")

    def stop(self) -> None:
        """SIGTERM each process we started, then SIGKILL its own process group if it lingers."""
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []

    def restart(self) -> None:
        self.stop()
        self.close()
        self.start()

    def pids(self) -> list[tuple[str, int]]:
        return [(role, proc.pid) for role, proc in self.procs if proc.poll() is None]

    def backend_pids(self) -> list[int]:
        """The PostgreSQL backends serving this target's database (not the harness's own)."""
        with self.db.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return [int(row[0]) for row in cur.fetchall()]

    # -- database access ---------------------------------------------------

    @property
    def db(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = self.server.connect(self.database)
        return self._conn

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None

    def query(self, sql: str, params: dict[str, Any] | tuple[Any, ...] | None = None) -> Any:
        with self.db.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0] if cur.description else None

    def bulk_labels(
        self,
        machine: str,
        state: str,
        prefix: str,
        count: int,
        metadata: dict[str, Any],
        *,
        due: bool = False,
    ) -> None:
        """``count`` labels ``PREFIX-0`` .. ``PREFIX-(count-1)`` sitting in ``state``, via SQL."""
        raise NotImplementedError

    def analyze(self) -> None:
        self.query("ANALYZE")

    def max_history_id(self) -> int:
        return int(self.query("SELECT coalesce(max(id), 0) FROM history"))

    def transitions(self, machine: str, old: str, new: str, since_id: int) -> int:
        """History rows recording ``old`` -> ``new`` in ``machine`` written after ``since_id``."""
        return int(
            self.query(
                f"SELECT count(*) FROM history WHERE id > %(since)s "
                f"AND {self.history_machine_column} = %(m)s "
                f"AND old_state = %(old)s AND new_state = %(new)s",
                {"since": since_id, "m": machine, "old": old, "new": new},
            )
        )

    def next_interval_tick(self, after: float, interval: float = 60) -> float | None:
        """When the next interval-trigger run starts after ``after``, if it can be known."""
        raise NotImplementedError


class Project(Target):
    """This repository's service: ``serve`` + ``cron`` as the Procfile runs them.

    ``variant`` (see :data:`VARIANTS`): ``project`` as deployed by default,
    ``plain`` with metrics off (``ROUTEMASTER_METRICS=0``), ``secured`` with
    ``api: {authentication: tokens}`` and every request carrying a token.
    ``tree`` is the checkout whose code runs (default: the one holding this
    bench), so two versions can be measured with the same harness.
    """

    history_machine_column = "state_machine"

    def __init__(
        self,
        server: Server,
        log_dir: Path,
        variant: str = "project",
        *,
        slot: int = 0,
        tree: Path = REPO,
    ) -> None:
        super().__init__(server, log_dir)
        assert variant in VARIANTS, variant
        self.name = variant
        self.cwd = tree
        # Each variant (and slot) on its own database and port, so they can run side by side.
        base = f"bench_{variant}" if slot == 0 else f"bench_{variant}_{slot}"
        self.database = base + RUN_SUFFIX

    def _cli(self, *args: str) -> list[str]:
        configs = ["-c", str(CONFIG)]
        if self.name == "secured":
            configs += ["-c", str(SECURED)]
        return [sys.executable, "-m", "routemaster", *configs, *args]

    def _env(self) -> dict[str, str]:
        pythonpath = os.pathsep.join(filter(None, [str(self.cwd), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": self.server.url(self.database), "PYTHONPATH": pythonpath}
        if self.name == "plain":
            env["ROUTEMASTER_METRICS"] = "0"
        return env

    def create_schema(self) -> None:
        subprocess.run(
            self._cli("migrate"),
            cwd=self.cwd,
            env={**os.environ, **self._env()},
            check=True,
            capture_output=True,
        )
        if self.name == "secured":
            scopes = ("--scope", "read", "--scope", "write", "--scope", "operate")
            created = subprocess.run(
                self._cli("token", "create", "bench", *scopes),
                cwd=REPO,
                env={**os.environ, **self._env()},
                check=True,
                capture_output=True,
                text=True,
            )
            secret = created.stdout.strip()
            self.auth_headers = {"Authorization": f"Bearer {secret}"}
            self.wrk_env = {"ROUTEMASTER_BENCH_TOKEN": secret}

    def commands(self) -> list[tuple[str, list[str], dict[str, str]]]:
        # The API alone and a worker (the Procfile's scale-apart lines), only the bind changed:
        # serve's CPU per request stays the API's, as in every earlier figure.
        return [
            (
                "serve",
                self._cli("serve", "--no-worker", "-b", f"127.0.0.1:{self.port}"),
                self._env(),
            ),
            ("cron", self._cli("cron"), self._env()),
        ]

    def bulk_labels(
        self,
        machine: str,
        state: str,
        prefix: str,
        count: int,
        metadata: dict[str, Any],
        *,
        due: bool = False,
    ) -> None:
        self.query(
            """
            WITH h AS (
                INSERT INTO history (state_machine, label, old_state, new_state, shard_key)
                SELECT %(m)s, %(p)s || '-' || g, NULL, %(s)s,
                       routemaster_shard_key(%(p)s || '-' || g)
                FROM generate_series(0, %(n)s - 1) g
                RETURNING id, label, shard_key
            )
            INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                                due_at, name_key, shard_key)
            SELECT %(m)s, label, %(md)s, %(s)s, now(), id, CASE WHEN %(due)s THEN now() END,
                   routemaster_label_key(label), shard_key
            FROM h
            """,
            {"m": machine, "p": prefix, "s": state, "n": count, "md": Json(metadata), "due": due},
        )

    def next_interval_tick(self, after: float, interval: float = 60) -> float | None:
        # Occurrences are multiples of the interval since the Unix epoch.
        return math.ceil(after / interval) * interval


class Reference(Target):
    """thread/routemaster 1.5.0 from PyPI, ``serve`` under gunicorn (its cron is a thread in it)."""

    name = "reference"
    database = "bench_reference" + RUN_SUFFIX
    history_machine_column = "label_state_machine"

    def __init__(self, server: Server, log_dir: Path, workers: int) -> None:
        super().__init__(server, log_dir)
        self.workers = workers

    def _env(self) -> dict[str, str]:
        env = {
            "DB_HOST": self.server.host,
            "DB_PORT": str(self.server.port),
            "DB_NAME": self.database,
            "DB_USER": self.server.user,
        }
        if self.server.password:
            env["DB_PASS"] = self.server.password
        return env

    def create_schema(self) -> None:
        script = (
            "import sqlalchemy, sys; from routemaster.db import metadata; "
            "metadata.create_all(sqlalchemy.create_engine(sys.argv[1]))"
        )
        subprocess.run(
            [str(REFERENCE_VENV / "bin" / "python"), "-c", script, self.server.url(self.database)],
            cwd=BENCH_DIR,
            check=True,
            capture_output=True,
        )

    def commands(self) -> list[tuple[str, list[str], dict[str, str]]]:
        argv = [
            str(REFERENCE_VENV / "bin" / "routemaster"),
            "--config-file",
            str(CONFIG),
            "serve",
            "-b",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(self.workers),
        ]
        return [("serve", argv, self._env())]

    def bulk_labels(
        self,
        machine: str,
        state: str,
        prefix: str,
        count: int,
        metadata: dict[str, Any],
        *,
        due: bool = False,
    ) -> None:
        params = {"m": machine, "p": prefix, "s": state, "n": count, "md": Json(metadata)}
        self.query(
            """
            INSERT INTO labels (name, state_machine, metadata, metadata_triggers_processed,
                                deleted, updated)
            SELECT %(p)s || '-' || g, %(m)s, %(md)s, true, false, now()
            FROM generate_series(0, %(n)s - 1) g
            """,
            params,
        )
        self.query(
            """
            INSERT INTO history (label_name, label_state_machine, created, forced,
                                 old_state, new_state)
            SELECT %(p)s || '-' || g, %(m)s, now(), false, NULL, %(s)s
            FROM generate_series(0, %(n)s - 1) g
            """,
            params,
        )

    def next_interval_tick(self, after: float, interval: float = 60) -> float | None:
        # Its `schedule` jobs run one interval after the previous run ended, counted
        # from when its cron thread started: not knowable from outside to the second.
        return None
