"""What a claim costs on Citus beside one server (issue 35, docs/performance.md "Claims on Citus").

    .venv/bin/python bench/claims_citus.py --plain postgresql://root@127.0.0.1:5432/postgres \\
        [--citus postgresql://root@127.0.0.1:9730/routemaster] [--labels 20000] [--rounds 50]

Without ``--citus``, one server alone (what a change costs plain PostgreSQL).

In a scratch database on each (made and dropped here; on Citus on every node,
as ``tests/citus_cluster.py`` does), ``--labels`` labels are inserted
straight into a gate, a webhook action and a pull action, all due, spread
over every shard. Then each claim runs ``--rounds`` times in a transaction
that is rolled back (so every round finds the same work): due gates (500,
the batch size), deliveries (16 free slots, one receiver) and a pull claim
(10 tasks). Reported per claim: the median and p90 wall time of a round, and
the statements a round sends (counted by an execution listener in one extra
round, so the timed rounds run as in production).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from routemaster.db import label_claims
from routemaster.db.label_claims import Wanted
from routemaster.db.plumbing.database import create_engine, normalise_url
from routemaster.db.tasks import Lease
from routemaster.db.upgrade import upgrade
from tests.citus_cluster import fresh_cluster_database

_FILL = """
    INSERT INTO labels (state_machine, name, name_key, shard_key, state, metadata, due_at,
                        state_entered_at, entry_id)
    SELECT 'm', 'l' || i, convert_to('l' || i, 'UTF8'), routemaster_shard_key('l' || i),
           (ARRAY['gate', 'hook', 'pull'])[i %% 3 + 1], '{}', now() - i * interval '1 ms',
           now(), i
    FROM generate_series(1, %(labels)s) AS i
    """


@contextmanager
def plain_database(server: str) -> Iterator[str]:
    url = sa.engine.make_url(normalise_url(server))
    name = f"routemaster_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    made = url.set(database=name).render_as_string(hide_password=False)
    engine = create_engine(made)
    upgrade(engine)
    engine.dispose()
    try:
        yield made
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


def rounds(engine: sa.Engine, claim: Callable[[sa.Connection], int], count: int) -> list[float]:
    times = []
    for _ in range(count):
        with engine.connect() as conn:
            started = time.perf_counter()
            with conn.begin() as transaction:
                claim(conn)
                transaction.rollback()
            times.append(time.perf_counter() - started)
    return times


def statements(engine: sa.Engine, claim: Callable[[sa.Connection], int]) -> int:
    sent: list[str] = []

    def seen(*args: object) -> None:
        sent.append(str(args[2]))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        rounds(engine, claim, 1)
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    return len(sent)


def measure(url: str, labels: int, count: int) -> dict[str, tuple[float, float, int, int]]:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(_FILL, {"labels": labels})
    now = datetime.datetime.now(datetime.UTC)
    later = now + datetime.timedelta(minutes=1)
    work: dict[str, Callable[[sa.Connection], int]] = {
        "due gates (500)": lambda conn: len(
            label_claims.lock_due_gates(conn, [("m", "gate")], limit=500, now=now)
        ),
        "deliveries (16)": lambda conn: len(
            label_claims.claim_deliveries(
                conn,
                [Wanted("r", 16)],
                [("r", "m", "hook")],
                free=16,
                now=now,
                lease_until=later,
                worker_id="w",
            )
        ),
        "pull tasks (10)": lambda conn: len(
            label_claims.claim_tasks(
                conn,
                [("m", "pull", Lease(30, "fixed", 0))],
                ids=[uuid.uuid4().hex for _ in range(10)],
                worker="w",
                now=now,
            )
        ),
    }
    results = {}
    for name, claim in work.items():
        rounds(engine, claim, 3)  # warm: the placement read once, plans cached
        with engine.connect() as conn, conn.begin() as transaction:
            got = claim(conn)
            transaction.rollback()
        times = sorted(rounds(engine, claim, count))
        results[name] = (
            statistics.median(times) * 1000,
            times[int(len(times) * 0.9)] * 1000,
            statements(engine, claim),
            got,
        )
    engine.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", required=True)
    parser.add_argument("--citus")
    parser.add_argument("--labels", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=50)
    options = parser.parse_args()
    with plain_database(options.plain) as url:
        plain = measure(url, options.labels, options.rounds)
    citus = {}
    if options.citus:
        with fresh_cluster_database(
            f"routemaster_bench_{uuid.uuid4().hex[:10]}", options.citus
        ) as made:
            citus = measure(made.url, options.labels, options.rounds)
    print(f"{options.labels} labels due, {options.rounds} rounds each (ms: median / p90)")
    print(f"{'claim':<18} {'one server':>22} {'Citus, 2 workers' if citus else '':>28}")
    for name in plain:
        p = plain[name]
        line = f"{name:<18} {p[0]:7.1f} / {p[1]:6.1f} {p[2]:2d} st {p[3]:3d}"
        if citus:
            c = citus[name]
            line += f"   {c[0]:7.1f} / {c[1]:6.1f} {c[2]:3d} st {c[3]:3d}"
        print(line)


if __name__ == "__main__":
    main()
