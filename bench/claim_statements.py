"""Each claim's statement beside its form at an earlier revision, on one server (single-server
speed of a claims change; docs/performance.md "Claims on Citus: one statement per rule").

    PYTHONPATH=. .venv/bin/python bench/claim_statements.py \\
        --plain postgresql://root@127.0.0.1:5432/postgres --base 48b21b9 [--rounds 300]

In a scratch database migrated by this checkout, 20,000 labels are made due
(as ``bench/claims_citus.py`` does). Each claim (due gates, deliveries, pull
tasks) is run once through the modules at ``--base`` (read with ``git show``)
and once through this checkout's, and the statement each sends is captured;
then the two statements are run alternately ``--rounds`` times on one
connection, each rolled back. Printed: the median wall time of each and
their ratio (the plans share the database, its indexes and its caches, so
the ratio is the statements' own).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from claims_citus import _FILL, plain_database  # noqa: E402

from routemaster.db import label_claims  # noqa: E402
from routemaster.db.label_claims import Wanted  # noqa: E402
from routemaster.db.plumbing.database import create_engine  # noqa: E402
from routemaster.db.tasks import Lease  # noqa: E402


def module_at(revision: str, path: str, name: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--rounds", type=int, default=300)
    options = parser.parse_args()
    now = datetime.datetime.now(datetime.UTC)
    later = now + datetime.timedelta(minutes=1)
    # The claims' modules and function names at --base (before issue 34: one module per
    # claim) and in this checkout (one module of label claims). The base's claims module
    # goes under its own name, which its receiver claims import.
    old = {
        "gates": module_at(
            options.base, "routemaster/db/claims.py", "routemaster.db.claims"
        ).lock_due_gates,
        "deliveries": module_at(
            options.base, "routemaster/db/receiver_claims.py", "base_receiver_claims"
        ).claim,
        "tasks": module_at(options.base, "routemaster/db/task_claims.py", "base_task_claims").claim,
    }
    new = {
        "gates": label_claims.lock_due_gates,
        "deliveries": label_claims.claim_deliveries,
        "tasks": label_claims.claim_tasks,
    }
    work: dict[str, Callable[[dict[str, Any], sa.Connection], object]] = {
        "due gates (500)": lambda m, conn: m["gates"](conn, [("m", "gate")], limit=500, now=now),
        "deliveries (16)": lambda m, conn: m["deliveries"](
            conn,
            [Wanted("r", 16)],
            [("r", "m", "hook")],
            free=16,
            now=now,
            lease_until=later,
            worker_id="w",
        ),
        "pull tasks (10)": lambda m, conn: m["tasks"](
            conn,
            [("m", "pull", Lease(30, "fixed", 0))],
            ids=[uuid.uuid4().hex for _ in range(10)],
            worker="w",
            now=now,
        ),
    }
    with plain_database(options.plain) as url:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(_FILL, {"labels": 20000})
        print(f"{'claim':<18} {options.base:>10} {'this':>10} {'this/base':>10}")
        for name, claim in work.items():
            sent = {
                label: _sent(engine, modules, claim)
                for label, modules in (("old", old), ("new", new))
            }
            times = _alternate(engine, sent, options.rounds)
            before, after = statistics.median(times["old"]), statistics.median(times["new"])
            print(f"{name:<18} {before * 1000:8.2f}ms {after * 1000:8.2f}ms {after / before:10.3f}")
        engine.dispose()


def _sent(
    engine: sa.Engine,
    modules: dict[str, Any],
    claim: Callable[[dict[str, Any], sa.Connection], object],
) -> tuple[str, Any]:
    """The last statement ``claim`` sends through ``modules``, with its parameters."""
    captured: list[tuple[str, Any]] = []

    def seen(*args: Any) -> None:
        captured.append((args[2], args[3]))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with engine.connect() as conn, conn.begin() as transaction:
            claim(modules, conn)
            transaction.rollback()
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    return captured[-1]


def _alternate(
    engine: sa.Engine, sent: dict[str, tuple[str, Any]], rounds: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {label: [] for label in sent}
    with engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        cursor = dbapi.cursor()
        for number in range(rounds):
            for label in sorted(sent, reverse=bool(number % 2)):
                statement, parameters = sent[label]
                started = time.perf_counter()
                cursor.execute(statement, parameters)
                times[label].append(time.perf_counter() - started)
                dbapi.rollback()
    return times


if __name__ == "__main__":
    main()
