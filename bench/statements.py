"""What one webhook delivery and one pull claim+complete send to each node, statement by statement.

    python bench/statements.py --coordinator postgresql://root@127.0.0.1:9900/routemaster
        [--targets plain,citus] [--labels 600] [--clients 4] [--only deliveries,pull] [--top 20]

The work of ``bench/citus.py``'s ``deliveries`` and ``pull`` phases (the same configuration,
the same drain and the same pull clients), counted by ``pg_stat_statements`` on every node
(the coordinator and each worker; the plain target is a database on the coordinator's own
server). Each node must load it: ``shared_preload_libraries = 'citus,pg_stat_statements'``
in its ``postgresql.conf``, and a restart. The statistics are reset after the labels are
created and read when the phase ends; per node, the statements of the target's database, shard
names folded (``labels_102008`` -> ``labels_*``) so that a statement run on every shard is one
row: calls and milliseconds (planning and execution) per operation, most expensive first,
beside the CPU each server spent per operation (as ``bench/citus.py`` reads it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from citus import (  # noqa: E402
    CONFIG,
    Target,
    _postmaster,
    citus_target,
    drain,
    plain_target,
    pull,
    receiver_at,
    server_cpu,
)
from pooler import rate  # noqa: E402

from routemaster.db.plumbing.database import create_engine  # noqa: E402
from routemaster.db.upgrade import upgrade  # noqa: E402
from tests.serving import free_port, serve_process  # noqa: E402

_SHARD = re.compile(r"\b([a-z_]+?)_\d{6,}\b")
_INTERMEDIATE = re.compile(r"\b(insert_select|intermediate_result|repartitioned_results)_[0-9_]+")
_LIST = re.compile(r"\$\d+(?:, ?\$\d+)*")
_SPACE = re.compile(r"\s+")
_STATS = sa.text(
    "SELECT query, calls, total_plan_time + total_exec_time, rows FROM pg_stat_statements"
    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = :database)"
)


def fold(query: str) -> str:
    """One line per statement, whatever the shard it ran on."""
    query = _INTERMEDIATE.sub(r"\1_*", _SHARD.sub(r"\1_*", query))
    return _SPACE.sub(" ", _LIST.sub("$n", query)).strip()


def node_urls(target: Target) -> list[tuple[str, sa.URL]]:
    """Each node's ``postgres`` database, where the statistics are read (a worker refuses
    ``CREATE EXTENSION`` in a Citus database)."""
    url = sa.engine.make_url(target.url)
    nodes = [("coordinator", target.coordinator)] + [
        (f"worker {n}", node) for n, node in enumerate(target.workers, 1)
    ]
    return [(name, node.url(url, "postgres")) for name, node in nodes]


def on_each(urls: list[tuple[str, sa.URL]], statement: str) -> None:
    for _, url in urls:
        engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sa.text(statement))
        engine.dispose()


def stats(url: sa.URL, database: str) -> dict[str, tuple[int, float, int]]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    found: dict[str, tuple[int, float, int]] = {}
    with engine.connect() as conn:
        for query, calls, ms, rows in conn.execute(_STATS, {"database": database}):
            key = fold(query)
            c, m, r = found.get(key, (0, 0.0, 0))
            found[key] = (c + calls, m + ms, r + rows)
    engine.dispose()
    return found


def measure(
    target: Target,
    args: argparse.Namespace,
    config: Path,
    phase: str,
    received: Callable[[], int],
) -> None:
    upgrade(create_engine(target.url))
    urls = node_urls(target)
    on_each(urls, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    url = sa.engine.make_url(target.url)
    postmasters = [_postmaster(node, url) for node in (target.coordinator, *target.workers)]
    prefix = f"s{uuid.uuid4().hex[:6]}"
    machine = "flow" if phase == "deliveries" else "pull"

    def create(session, base: str, client: int, i: int) -> int:  # type: ignore[no-untyped-def]
        name = f"{base}/state-machines/{machine}/labels/{prefix}-{client}-{i}"
        return int(session.post(name, json={"metadata": {}}).status_code)

    env = {"ROUTEMASTER_DIRECT_DATABASE_URL": target.url}
    with serve_process(config, target.url, "--workers", "2", env=env) as (_, base):
        rate(base, args.clients, None, create, per_client=-(-args.labels // args.clients))
        on_each(urls, "SELECT pg_stat_statements_reset()")
        before = [server_cpu(p) for p in postmasters]
        run: Callable[[], tuple[float, int]] = (
            (lambda: drain(target.url, config, 1, received))
            if phase == "deliveries"
            else (lambda: pull(base, args.clients))
        )
        per_second, count = run()
        after = [server_cpu(p) for p in postmasters]
    print(f"\n## {target.name}: {phase}, {count} operations, {per_second:.1f}/s")
    for (name, node_url), b, a in zip(urls, before, after, strict=True):
        found = stats(node_url, url.database or "")
        calls = sum(c for c, _, _ in found.values())
        ms = sum(m for _, m, _ in found.values())
        print(
            f"\n### {name}: CPU {1000 * (a - b) / count:.2f} ms/op;"
            f" {calls / count:.1f} statements/op, {ms / count:.2f} ms/op in them"
        )
        print(f"{'calls/op':>9} {'ms/op':>7} {'ms/call':>8} {'rows/call':>9}  statement")
        ranked = sorted(found.items(), key=lambda item: -item[1][1])
        for query, (c, m, r) in ranked[: args.top]:
            text = query if len(query) <= args.width else query[: args.width] + "..."
            print(f"{c / count:9.2f} {m / count:7.3f} {m / c:8.3f} {r / c:9.1f}  {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=os.environ.get("ROUTEMASTER_TEST_CITUS_URL"))
    parser.add_argument("--plain", help="a plain server (default: the coordinator's own)")
    parser.add_argument("--targets", default="plain,citus")
    parser.add_argument("--labels", type=int, default=600)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--only", default="deliveries,pull")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--width", type=int, default=160)
    args = parser.parse_args()
    if not args.coordinator:
        parser.error("--coordinator (or ROUTEMASTER_TEST_CITUS_URL) names no Citus coordinator")
    port = free_port()
    config = Path(f"/tmp/routemaster-bench-statements-{os.getpid()}.yaml")
    config.write_text(CONFIG.format(port=port))

    with receiver_at(port) as received:
        for phase in args.only.split(","):
            for name in args.targets.split(","):
                database = f"bench_statements_{name}_{os.getpid()}"
                made = (
                    plain_target(args.plain or args.coordinator, database)
                    if name == "plain"
                    else citus_target(args.coordinator, database)
                )
                with made as target:
                    measure(target, args, config, phase, received)
    config.unlink()


if __name__ == "__main__":
    main()
