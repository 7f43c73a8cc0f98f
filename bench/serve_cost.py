"""Serve CPU per request over HTTP, two checkouts turn about: what a change costs gunicorn + app.

``python bench/serve_cost.py BEFORE_TREE AFTER_TREE [--rounds 6] [-n 3000]`` starts
``routemaster -c bench/bench.yaml serve --workers 1`` (``--no-worker`` where the
tree has it: the API alone) from each tree in turn (the order alternating every
round), sends ``n`` reads, ``n`` creates, then ``n`` updates of the labels it
created (each through a gate: a move) over one kept-alive connection from this
process, and reads the serve process tree's CPU (every process under it, from
/proc) before and after each. It prints each run, then
per operation the median of each side and the median of the per-round ratios
(after / before): a paired comparison, so load elsewhere on a shared machine
disturbs it less than two separate runs. The client's own CPU is not counted.
Needs ``DATABASE_URL`` (migrated, with the ``r-*`` labels ``bench/inprocess.py`` makes);
``--before-database-url`` / ``--after-database-url`` give each side its own database, for
trees whose schemas differ (each migrated by its own tree, with its own ``r-*`` labels).
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

OPERATIONS = ("read", "create", "update")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants so far."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    pids = [pid]
    for each in pids:  # grows while walking: children, grandchildren, ...
        pids.extend(child for child, parent in parents.items() if parent == each)
    ticks = 0
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _has_no_worker(tree: str) -> bool:
    """Whether the checkout's ``serve`` also starts a worker unless told ``--no-worker``."""
    serve = Path(tree) / "routemaster" / "cli" / "serve.py"
    return serve.exists() and "--no-worker" in serve.read_text()


def _run(tree: str, n: int, database_url: str | None) -> dict[str, float]:
    """Microseconds of serve CPU per request, per operation, for the checkout ``tree``."""
    port = _free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("DB_")}
    env["PYTHONPATH"] = tree
    if database_url:
        env["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "routemaster", "-c", "bench/bench.yaml", "serve"]
    if _has_no_worker(tree):
        command.append("--no-worker")  # the API alone, as before SPEC D0: no cron worker's CPU
    serve = subprocess.Popen(
        [*command, "-b", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                probe = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                probe.request("GET", "/")
                probe.getresponse().read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        prefix = uuid.uuid4().hex[:8]
        costs = {}
        for operation in OPERATIONS:

            def send(i: int, operation: str = operation) -> None:
                if operation == "read":
                    conn.request("GET", f"/state-machines/flow/labels/r-{i % 1000}")
                else:  # an update moves the label this run created through its gate
                    conn.request(
                        "POST" if operation == "create" else "PATCH",
                        f"/state-machines/flow/labels/{prefix}-{i}",
                        body=b'{"metadata": {}}'
                        if operation == "create"
                        else b'{"metadata": {"go": true}}',
                        headers={"Content-Type": "application/json"},
                    )
                response = conn.getresponse()
                response.read()
                if response.status not in (200, 201):
                    raise RuntimeError(f"{operation}: {response.status}")

            for i in range(200):  # warm-up
                send(10**6 + i)
            started = _tree_cpu(serve.pid)
            for i in range(n):
                send(i)
            costs[operation] = (_tree_cpu(serve.pid) - started) / n * 1e6
        return costs
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("-n", type=int, default=3000)
    parser.add_argument("--before-database-url")
    parser.add_argument("--after-database-url")
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    databases = {"before": args.before_database_url, "after": args.after_database_url}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for side in order:
            costs = _run(trees[side], args.n, databases[side])
            runs[side].append(costs)
            print(round_, side, {k: round(v) for k, v in costs.items()}, flush=True)
    for operation in OPERATIONS:
        before = [run[operation] for run in runs["before"]]
        after = [run[operation] for run in runs["after"]]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        print(
            f"{operation}: serve CPU per request {statistics.median(before):.0f} -> "
            f"{statistics.median(after):.0f} us (medians), after/before per round: "
            f"median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
