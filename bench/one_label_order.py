"""What serialising one label's writers costs a write: the plain statements against the ones
that first take the label's advisory lock (routemaster/db/labels.py says why), paired.

``.venv/bin/python bench/one_label_order.py [--labels 1000] [--rounds 24] [--async-commit]``
makes a scratch database on ``DATABASE_URL``'s server (default: the local one), creates the
labels, then in every round runs both variants over every label, the order alternating by
round, each write its own transaction on one connection:

- ``merge``: a metadata merge (an API ``PATCH`` that moves nothing);
- ``lock+move``: the label's lock, then its move one state on (the worker, an operator).

It prints, per write, the median over the rounds of the wall time and of the PostgreSQL
backend's CPU (read from ``/proc``: the server must run on this machine), and the median of
the per-round ratios (serialised / plain). ``--async-commit`` sets ``synchronous_commit = off``
on the connection, so the WAL flush at commit does not drown the difference.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from routemaster.db import labels, transitions
from routemaster.db.labels import Moves, label_from_row, label_params
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import fetch_one
from routemaster.db.upgrade import upgrade

NOW = datetime.datetime(2026, 11, 28, tzinfo=datetime.UTC)
VARIANTS = {
    "merge": {
        "plain": transitions.creation._MERGE_METADATA,
        "serialised": transitions.creation._SERIALISED_MERGE_METADATA,
    },
    "lock+move": {
        "plain": labels._SELECT_FOR_UPDATE,
        "serialised": labels._SERIALISED_SELECT_FOR_UPDATE,
    },
}


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(conn: sa.Connection, pid: int, op: str, sql: str, names: list[str], n: int) -> tuple:
    cpu, start = _backend_cpu(pid), time.perf_counter()
    for name in names:
        params = {**label_params("m", name), "patch": f'{{"n": {n}}}', "now": NOW}
        with conn.begin():
            row = fetch_one(conn, sql, {**params, "scheduled_states": []})
            assert row is not None
            if op == "lock+move":
                label = label_from_row(row)
                other = "b" if label.state == "a" else "a"
                transitions.write_moves(conn, [Moves(label, (other,), None)], now=NOW)
    wall, cpu = time.perf_counter() - start, _backend_cpu(pid) - cpu
    return wall / len(names) * 1e6, cpu / len(names) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--async-commit", action="store_true")
    args = parser.parse_args()
    server = sa.engine.make_url(
        os.environ.get("DATABASE_URL", "postgresql+psycopg2://root@127.0.0.1:5432/postgres")
    )
    database = f"one_label_order_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
    try:
        engine = create_engine(server.set(database=database).render_as_string(False))
        upgrade(engine)
        names = [f"l{i}" for i in range(args.labels)]
        for name in names:
            with engine.begin() as conn:
                transitions.insert(conn, "m", name, {}, state="a", now=NOW)
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        with engine.connect() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            if args.async_commit:
                conn.exec_driver_sql("SET synchronous_commit = off")
            conn.commit()
            for n in range(args.rounds):
                for op, pair in VARIANTS.items():
                    order = ("plain", "serialised") if n % 2 == 0 else ("serialised", "plain")
                    for variant in order:
                        run = _round(conn, pid, op, pair[variant], names, n)
                        runs.setdefault((op, variant), []).append(run)
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    for op in VARIANTS:
        plain, serialised = runs[(op, "plain")], runs[(op, "serialised")]
        for what, at in (("wall", 0), ("backend CPU", 1)):
            before = [run[at] for run in plain]
            after = [run[at] for run in serialised]
            ratio = statistics.median(a / b for a, b in zip(after, before, strict=True) if b)
            print(
                f"{op:10} {what:11} us/write: plain {statistics.median(before):7.1f}"
                f"  serialised {statistics.median(after):7.1f}  paired ratio {ratio:.3f}"
            )


if __name__ == "__main__":
    main()
