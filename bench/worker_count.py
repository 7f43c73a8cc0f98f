"""Requests/s of ``serve`` by its number of request workers, turn about.

    .venv/bin/python bench/worker_count.py [--workers 2,4] [--rounds 4] [--seconds 5]

On a fresh database of the server ``DATABASE_URL`` names (made and dropped
here, with 1,000 labels, as ``bench/run`` makes it), one ``serve --no-worker``
per worker count runs at once, each on its own port, with tokens and metrics on
(``bench/bench-secured.yaml``, as the comparison with 1.5.0 runs it). Each
round drives reads of those labels and then creates at 16 clients (wrk,
``bench/lua/bench.lua``) through every server in turn, the order rotating each
round, so a load that comes and goes on a shared machine falls on every count
alike. Prints each round, then per
worker count and scenario the median rate and its ratio to the first count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from measure import Server, run_wrk
from targets import Project, free_port

LABELS = 1000
CLIENTS = 16


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"serve did not answer on {base}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4", help="worker counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="per scenario and server")
    args = parser.parse_args()
    counts = [int(each) for each in args.workers.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="routemaster-worker-count-"))
    # The bench's own target for its database, token and labels; the servers are started here.
    target = Project(Server.from_environment(), logs, "secured")
    target.fresh_database()
    target.bulk_labels("flow", "start", "r", LABELS, {"n": 0, "go": False})
    target.analyze()
    serving: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
    try:
        for count in counts:
            port = free_port()
            log = open(logs / f"serve-{count}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                target._cli("serve", "--no-worker", "-b", f"127.0.0.1:{port}"),
                env={**os.environ, **target._env(), "WEB_CONCURRENCY": str(count)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            serving[count] = (f"http://127.0.0.1:{port}", proc)
        for base, proc in serving.values():
            _wait_ready(base, proc)
        rates: dict[tuple[int, str], list[float]] = {}
        for round_ in range(-1, args.rounds):  # round -1 warms every server up
            shift = max(round_, 0) % len(counts)
            line = []
            for count in counts[shift:] + counts[:shift]:
                base = serving[count][0]
                for mode in ("read", "create"):
                    result = run_wrk(
                        base,
                        mode=mode,
                        machine="flow",
                        prefix="r" if mode == "read" else f"c{count}x{round_ + 1}",
                        n=LABELS,
                        connections=CLIENTS,
                        duration=args.seconds if round_ >= 0 else 2,
                        env=target.wrk_env,
                    )
                    if result["errors"]:
                        raise RuntimeError(f"{count} workers, {mode}: {result}")
                    if round_ >= 0:
                        rates.setdefault((count, mode), []).append(result["rate"])
                    line.append(f"{count} workers {mode} {result['rate']:,.0f}/s")
            if round_ >= 0:
                load = Path("/proc/loadavg").read_text().split()[0]
                print(f"round {round_ + 1}: " + ", ".join(line) + f" (load {load})", flush=True)
        first = counts[0]
        for mode in ("read", "create"):
            for count in counts:
                median = statistics.median(rates[count, mode])
                ratio = median / statistics.median(rates[first, mode])
                print(f"{mode:<6} {count} workers: median {median:,.0f}/s ({ratio:.2f}x {first})")
    finally:
        for _, proc in serving.values():
            proc.terminate()
        for _, proc in serving.values():
            proc.wait(timeout=30)
        target.close()
        target.server.drop(target.database)


if __name__ == "__main__":
    main()
