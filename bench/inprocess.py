"""CPU per request of the WSGI application alone, in one process: no gunicorn, no wrk.

The HTTP scenarios of ``bench/run`` share two cores with wrk and PostgreSQL,
so their figures move with whatever else runs. This calls the API's WSGI
callable directly, as gunicorn's worker does, with the same requests wrk
sends (create, read, update through a gate), against a real database, and
reports the process CPU time per request: what our Python costs, apart from
the HTTP server's own share. ``--profile`` adds a cProfile of one scenario.

    DATABASE_URL=postgresql://postgres@127.0.0.1/some_db \\
        PYTHONPATH=<tree> python bench/inprocess.py [-n 3000] [--profile read]

PostgreSQL's CPU per request is read from /proc when the server runs here.
The database is migrated and given the 1,000 ``r-*`` labels the read
scenario uses; created and updated labels get a fresh prefix per run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent / "bench.yaml"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def environ(method: str, path: str, body: bytes = b"") -> dict[str, Any]:
    """What gunicorn's sync worker hands the application for one request."""
    env: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "RAW_URI": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "18301",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "40000",
        "HTTP_HOST": "127.0.0.1:18301",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if body:
        env["CONTENT_TYPE"] = "application/json"
        env["CONTENT_LENGTH"] = str(len(body))
        env["HTTP_CONTENT_TYPE"] = "application/json"
        env["HTTP_CONTENT_LENGTH"] = str(len(body))
    return env


def call(app: WSGIApp, env: dict[str, Any], expect: int) -> None:
    status: list[str] = []

    def start_response(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        status.append(s)
        return lambda data: None

    result = app(env, start_response)
    try:
        for _ in result:
            pass
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not status or int(status[0].split()[0]) != expect:
        raise RuntimeError(f"{env['REQUEST_METHOD']} {env['PATH_INFO']}: {status}")


def backend_cpu(monitor: Any) -> float:
    """CPU seconds used so far by the database's other client backends (the app's connections).

    Read from /proc, so only when PostgreSQL runs on this machine; 0 otherwise.
    """
    with monitor.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        pids = [row[0] for row in cursor.fetchall()]
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def build(url: str) -> WSGIApp:
    """The app exactly as ``routemaster serve`` builds it in a worker (logging included)."""
    from routemaster.app import App
    from routemaster.cli.environment import settings_from_environment
    from routemaster.config.loader import load_config
    from routemaster.db.plumbing.database import create_engine
    from routemaster.logging import load_plugins
    from routemaster.web import create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
    )
    config = load_config([str(CONFIG)])
    engine = create_engine(url, pool_size=1, max_overflow=4)
    app = App(
        config=config,
        db=engine,
        settings=settings_from_environment(),
        loggers=tuple(load_plugins(config)),
    )
    wsgi: WSGIApp = create_app(app)
    return wsgi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=3000, help="requests per scenario")
    parser.add_argument("--profile", choices=["create", "read", "update"])
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args()

    import sqlalchemy as sa

    from routemaster.db.plumbing.database import normalise_url
    from routemaster.db.upgrade import upgrade

    url = normalise_url(os.environ["DATABASE_URL"])
    engine = sa.create_engine(url)
    upgrade(engine)
    app = build(url)
    prefix = uuid.uuid4().hex[:8]
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "DELETE FROM labels WHERE state_machine = 'flow' AND name LIKE 'r-%';"
                "WITH h AS (INSERT INTO history (state_machine, label, old_state, new_state, "
                "shard_key) "
                "SELECT 'flow', 'r-' || g, NULL, 'start', routemaster_shard_key('r-' || g) "
                "FROM generate_series(0, 999) g "
                "RETURNING id, label, shard_key) "
                "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, "
                "entry_id, name_key, shard_key) SELECT 'flow', label, "
                "'{\"n\": 0, \"go\": false}', 'start', now(), id, routemaster_label_key(label), "
                "shard_key FROM h"
            )
        )
        conn.execute(
            sa.text(
                "WITH h AS (INSERT INTO history (state_machine, label, old_state, new_state, "
                "shard_key) "
                "SELECT 'flow', :p || '-u-' || g, NULL, 'start', "
                "routemaster_shard_key(:p || '-u-' || g) "
                "FROM generate_series(0, :n) g "
                "RETURNING id, label, shard_key) "
                "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, "
                "entry_id, name_key, shard_key) SELECT 'flow', label, "
                "'{\"n\": 0, \"go\": false}', 'start', now(), id, routemaster_label_key(label), "
                "shard_key FROM h"
            ),
            {"p": prefix, "n": args.n * 2 + 100},
        )
    engine.dispose()
    monitor = engine.raw_connection()
    monitor.autocommit = True

    base = "/state-machines/flow/labels/"
    counter = {"create": 0, "update": 0}

    def request(kind: str, i: int) -> tuple[dict[str, Any], int]:
        if kind == "create":
            counter["create"] += 1
            body = b'{"metadata": {"n": %d, "go": false}}' % i
            return environ("POST", f"{base}{prefix}-c-{counter['create']}", body), 201
        if kind == "read":
            return environ("GET", f"{base}r-{(i * 7919) % 1000}"), 200
        counter["update"] += 1
        body = b'{"metadata": {"go": true}}'
        return environ("PATCH", f"{base}{prefix}-u-{counter['update']}", body), 200

    for kind in ("create", "read", "update"):
        for i in range(100):  # warm-up: imports, pool, caches
            env, expect = request(kind, i)
            call(app, env, expect)
        envs = [request(kind, i) for i in range(args.n)]
        profiler = cProfile.Profile(time.process_time) if args.profile == kind else None
        wall, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(monitor)
        if profiler is not None:
            profiler.enable()
        for env, expect in envs:
            call(app, env, expect)
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        server = backend_cpu(monitor) - server
        per_request = cpu * 1000 / args.n
        print(
            f"{kind:<7} {per_request:.3f} ms CPU/request  {wall * 1000 / args.n:.3f} ms wall  "
            f"PostgreSQL {server * 1000 / args.n:.3f} ms CPU/request"
        )
        if profiler is not None:
            stats = pstats.Stats(profiler)
            stats.sort_stats(args.sort).print_stats(45)


if __name__ == "__main__":
    main()
