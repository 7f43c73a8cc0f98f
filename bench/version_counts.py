"""A ``continue`` machine's labels per version (the machine page, its description) at 1M labels.

    .venv/bin/python bench/version_counts.py [--labels 1000000] [--older 1000] [--runs 5]

On a private PostgreSQL (initdb in a temporary directory, as bench/timers.py),
migrated by this checkout: ``--labels`` live labels of ``flow`` on version 2 (the
one in force) and ``--older`` on version 1, each with its first history entry.
Times, median of ``--runs`` after a warm-up, in one REPEATABLE READ snapshot as the
page reads them: the grouped count every version's labels answered before
(``BEFORE``: every label of every machine that keeps a version) and
the read now (``counts.versions_beside``: the labels on versions other than the one
in force), and checks that both give the same versions in use.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from timers import _server as private_server  # noqa: E402

from routemaster.db import counts  # noqa: E402
from routemaster.machine.upgrades import labels_by_version  # noqa: E402

FILL = """
    WITH wanted AS (
        SELECT g, nextval(pg_get_serial_sequence('history', 'id')) AS id
        FROM generate_series(%(first)s, %(last)s) AS g
    ), entries AS (
        INSERT INTO history (id, state_machine, label, old_state, new_state, created, shard_key,
                             version)
        SELECT id, 'flow', 'l-' || g, NULL, 'start', now(), routemaster_shard_key('l-' || g),
               %(version)s
        FROM wanted
    )
    INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                        created_at, updated_at, name_key, shard_key, version)
    SELECT 'flow', 'l-' || g, '{}', 'start', now(), id, now(), now(),
           routemaster_label_key('l-' || g), routemaster_shard_key('l-' || g), %(version)s
    FROM wanted
"""


# What counts.per_version ran before (removed): every label that keeps a version, grouped.
BEFORE = """
    SELECT state_machine, version, count(*) FROM labels
    WHERE version IS NOT NULL AND NOT deleted
    GROUP BY state_machine, version
    """


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--older", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with private_server(True) as url:
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(REPO)}
        subprocess.run(
            [sys.executable, "-m", "routemaster", "migrate"], env=env, check=True, cwd=REPO
        )
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://"))
        with engine.begin() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            with raw.cursor() as cursor:
                for first, last, version in (
                    (1, args.labels, 2),
                    (args.labels + 1, args.labels + args.older, 1),
                ):
                    for start in range(first, last + 1, 200_000):
                        cursor.execute(
                            FILL,
                            {
                                "first": start,
                                "last": min(last, start + 199_999),
                                "version": version,
                            },
                        )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE labels"))
        total = args.labels + args.older

        def before(conn: sa.Connection) -> dict[int, int]:
            rows = conn.exec_driver_sql(BEFORE).all()
            return {int(version): int(n) for machine, version, n in rows if machine == "flow"}

        def after(conn: sa.Connection) -> dict[int, int]:
            return counts.versions_beside(conn, "flow", 2)

        results = {}
        for name, read in (("before", before), ("after", after)):
            times = []
            for _ in range(args.runs + 1):
                with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
                    started = time.perf_counter()
                    kept = read(conn)
                    times.append(time.perf_counter() - started)
            results[name] = labels_by_version(2, total, kept)
            print(
                f"{name}: median {statistics.median(times[1:]) * 1000:.1f} ms "
                f"(runs {', '.join(f'{t * 1000:.1f}' for t in times[1:])}); "
                f"versions in use {results[name]}"
            )
        assert results["before"] == results["after"], results
        engine.dispose()


if __name__ == "__main__":
    main()
