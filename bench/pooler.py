"""Through PgBouncer in transaction mode beside the direct connection: requests/s and wake-ups.

``python bench/pooler.py [--seconds 15] [--clients 8] [--pool 5] [--wakeups 10]``
needs ``DATABASE_URL`` (a migrated database; its ``bench-*`` labels are made
here) and Debian's ``pgbouncer``. For each way in, it starts
``routemaster serve --no-worker`` with ``ROUTEMASTER_POLL_INTERVAL=0.5``:

- ``direct``: ``DATABASE_URL`` and ``ROUTEMASTER_DIRECT_DATABASE_URL`` both the
  database (``LISTEN`` wake-ups);
- ``pooled``: ``DATABASE_URL`` a PgBouncer in transaction mode with ``--pool``
  server connections, and no direct URL (polled wake-ups).

It runs ``--clients`` threads creating labels, then updating them (the first
PATCH of each moves it through a gate), for ``--seconds`` each, over kept-alive
connections, and prints requests/s; then ``--wakeups`` times a waiting claim
(``POST /tasks/claim`` with ``wait``) and the create that enters its action,
and prints the time from the create's answer to the claim's (the wake-up
latency: median and worst).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.pooler import running_pgbouncer  # noqa: E402
from tests.serving import serve_process  # noqa: E402

CONFIG = """
state_machines:
  bench:
    states:
      - gate: start
        triggers:
          - metadata: go
        exit_condition: metadata.go = true
        next: done
      - gate: done
        exit_condition: false
  jobs:
    states:
      - action: work
        worker: {lease: 30s}
        next: finished
      - gate: finished
        exit_condition: false
"""


def rate(
    base: str,
    clients: int,
    seconds: float | None,
    request: Callable[..., int],
    *,
    per_client: int | None = None,
) -> tuple[float, int]:
    """Requests/s of ``request(session, base, client, i)`` from ``clients`` threads, and how
    many were made: for ``seconds``, or until each client has made ``per_client``."""
    stop = time.monotonic() + seconds if seconds is not None else float("inf")
    counts = [0] * clients

    def run(client: int) -> None:
        session = requests.Session()
        while time.monotonic() < stop and (per_client is None or counts[client] < per_client):
            try:
                status = request(session, base, client, counts[client])
            except requests.ConnectionError:  # a kept-alive connection closed as it was reused
                session.close()
                session = requests.Session()
                continue
            assert status in (200, 201), status
            counts[client] += 1
        session.close()

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, range(clients)))
    return sum(counts) / (time.monotonic() - started), sum(counts)


def _wakeups(base: str, times: int) -> list[float]:
    latencies = []
    answered: dict[str, float] = {}
    for _ in range(times):
        while requests.post(f"{base}/tasks/claim", json={"worker": "b", "limit": 100}).json()[
            "tasks"
        ]:
            pass  # nothing claimable before the claim that waits

        def claim() -> None:
            answer = requests.post(f"{base}/tasks/claim", json={"worker": "b", "wait": 10})
            assert answer.json()["tasks"], answer.text
            answered["at"] = time.monotonic()

        thread = threading.Thread(target=claim)
        thread.start()
        time.sleep(0.7)  # the claim is waiting by then (a benchmark may sleep)
        name = uuid.uuid4().hex
        assert requests.post(
            f"{base}/state-machines/jobs/labels/{name}", json={"metadata": {}}
        ).status_code
        created = time.monotonic()
        thread.join()
        latencies.append(answered["at"] - created)
    return latencies


def _measure(base: str, args: argparse.Namespace, run: str) -> dict[str, float]:
    prefix = f"bench-{run}-{uuid.uuid4().hex[:6]}"

    def create(session: requests.Session, base: str, client: int, i: int) -> int:
        url = f"{base}/state-machines/bench/labels/{prefix}-{client}-{i}"
        return session.post(url, json={"metadata": {"n": i}}).status_code

    def update(session: requests.Session, base: str, client: int, i: int) -> int:
        # The client's first 50 labels in turn: the first PATCH of each moves it.
        url = f"{base}/state-machines/bench/labels/{prefix}-{client}-{i % 50}"
        return session.patch(url, json={"metadata": {"go": True, "i": i}}).status_code

    creates, _ = rate(base, args.clients, args.seconds, create)
    updates, _ = rate(base, args.clients, args.seconds, update)
    wakeups = _wakeups(base, args.wakeups)
    return {
        "creates/s": creates,
        "updates/s": updates,
        "wake-up median s": statistics.median(wakeups),
        "wake-up worst s": max(wakeups),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pool", type=int, default=5)
    parser.add_argument("--wakeups", type=int, default=10)
    args = parser.parse_args()
    url = os.environ["DATABASE_URL"]
    config = Path(f"/tmp/routemaster-bench-pooler-{os.getpid()}.yaml")
    config.write_text(CONFIG)
    results = {}
    polling = {"ROUTEMASTER_POLL_INTERVAL": "0.5"}
    with ExitStack() as stack:
        pooled = stack.enter_context(running_pgbouncer(url, pool_size=args.pool))
        for run, database, env in (
            ("direct", url, {"ROUTEMASTER_DIRECT_DATABASE_URL": url, **polling}),
            ("pooled", pooled, {"ROUTEMASTER_DIRECT_DATABASE_URL": "", **polling}),
        ):
            with serve_process(config, database, env=env) as (_, base):
                results[run] = _measure(base, args, run)
    config.unlink()
    print(f"{args.clients} clients, {args.seconds:g} s each, PgBouncer pool {args.pool}")
    print(f"{'':18}{'direct':>10}{'pooled':>10}")
    for key in results["direct"]:
        print(f"{key:18}{results['direct'][key]:>10.3f}{results['pooled'][key]:>10.3f}")


if __name__ == "__main__":
    main()
