"""Search and bulk commands at scale: ``?where=`` on indexed and unindexed paths, a bulk retry.

    python bench/search.py --labels 100000 [--labels 1000000] [--repeat 21]

For each size it makes a database of its own (dropped afterwards), fills
``labels`` directly with SQL (``generate_series``: a million rows in
seconds), builds the configuration's ``search:`` indexes as ``migrate``
does, then times requests through the API application in process (Flask's
test client: routing, compiling the expression, the statement, the JSON;
no HTTP server or network), and reports the median (p50) of ``--repeat``
runs of each:

- a page (``limit=100``) and a count (``count=true``) for an equality and a
  numeric range on an indexed path (``metadata.customer.id``,
  ``metadata.total``) and on unindexed paths with the same distributions
  (``metadata.account``, ``metadata.amount``);
- a bulk retry of 10,000 errored labels: accepted through the API (dry run,
  then ``expect``), carried out by ``run_batch`` as the worker loop calls it
  (``ROUTEMASTER_BATCH_SIZE`` labels a transaction, 500 by default), in
  labels per second.

Needs a PostgreSQL server it may create databases on: ``DATABASE_URL``'s
host, port and user, else ``postgres@127.0.0.1:5432``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scratch import ScratchDatabase

from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.db.plumbing.database import create_engine
from routemaster.db.search_indexes import ensure_search_index
from routemaster.db.upgrade import upgrade
from routemaster.service.bulk import run_batch
from routemaster.web import create_app

CONFIG = """
state_machines:
  order:
    search:
      - metadata.customer.id
      - metadata.total
    states:
      - gate: start
        exit_condition: metadata.paid = true
        triggers:
          - metadata: paid
        next: charge
      - action: charge
        webhook: http://127.0.0.1:9/charge
        next: done
      - gate: done
        exit_condition: false
"""

# customer.id and account: 10,000 values; total and amount: 0-999. Every 10th label is in
# the action, and of those every 5th errored (2% of all labels).
FILL = """
INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,
                    errored, previous_state, name_key, shard_key)
SELECT 'order', 'o' || lpad(i::text, 8, '0'),
       jsonb_build_object('customer', jsonb_build_object('id', 'c' || (i % 10000)),
                          'account', 'c' || (i % 10000),
                          'total', i % 1000, 'amount', i % 1000, 'paid', false),
       CASE WHEN i % 10 = 0 THEN 'charge' ELSE 'start' END,
       now() - make_interval(secs => i % 172800), 1,
       i % 50 = 0, CASE WHEN i % 10 = 0 THEN 'start' END,
       routemaster_label_key('o' || lpad(i::text, 8, '0')),
       routemaster_shard_key('o' || lpad(i::text, 8, '0'))
FROM generate_series(1, :count) AS i
"""

QUERIES = {
    "equality, indexed": 'metadata.customer.id = "c42"',
    "equality, unindexed": 'metadata.account = "c42"',
    "range, indexed": "metadata.total >= 995",
    "range, unindexed": "metadata.amount >= 995",
    "stuck a day, range indexed": (
        "metadata.total > 900 and 1d has passed since history.entered_state"
    ),
}


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(client: Any, url: str, repeat: int) -> tuple[float, Any]:
    samples, answer = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200, response.get_data(as_text=True)
        answer = response.get_json()
    return p50(samples), answer


def measure(count: int, repeat: int, bulk: int) -> dict[str, Any]:
    scratch = ScratchDatabase(f"routemaster_bench_search_{os.getpid()}_{count}")
    engine = create_engine(scratch.url)
    results: dict[str, Any] = {"labels": count}
    try:
        upgrade(engine)
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(sa.text(FILL), {"count": count})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE labels"))
        results["fill_seconds"] = round(time.perf_counter() - started, 1)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "bench-search.yaml"
            path.write_text(CONFIG)
            config = load_config([path])
        started = time.perf_counter()
        for machine in config.state_machines:
            for search_path in machine.search:
                ensure_search_index(engine, machine.name, search_path)
        results["index_seconds"] = round(time.perf_counter() - started, 1)
        app = App(config=config, db=engine, settings=Settings(statement_timeout=30))
        client = create_app(app).test_client()
        rows = {}
        for title, where in QUERIES.items():
            page_url = "/state-machines/order/labels?" + urlencode({"where": where, "limit": 100})
            count_url = "/state-machines/order/labels?" + urlencode(
                {"where": where, "count": "true"}
            )
            page_ms, page = timed(client, page_url, repeat)
            count_ms, counted = timed(client, count_url, repeat)
            rows[title] = {
                "where": where,
                "matches": counted["count"],
                "page_p50_ms": round(page_ms, 2),
                "page_size": len(page["labels"]),
                "count_p50_ms": round(count_ms, 2),
            }
        results["queries"] = rows
        results["bulk_retry"] = bulk_retry(app, client, engine, bulk)
    finally:
        engine.dispose()
        scratch.drop()
    return results


def bulk_retry(app: App, client: Any, engine: sa.Engine, size: int) -> dict[str, Any]:
    """Retry ``size`` errored labels in bulk; labels per second from acceptance to finished."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE labels SET errored = (name_key IN (SELECT name_key FROM labels"
                " WHERE state_machine = 'order' AND state = 'charge' ORDER BY name_key"
                " LIMIT :size)) WHERE state_machine = 'order' AND state = 'charge'"
            ),
            {"size": size},
        )
    request = {"command": "retry", "errored": True, "state": "charge", "reason": "bench"}
    counted = client.post("/state-machines/order/bulk", json={**request, "dry_run": True})
    expect = counted.get_json()["count"]
    started = time.perf_counter()
    accepted = client.post("/state-machines/order/bulk", json={**request, "expect": expect})
    assert accepted.status_code == 202, accepted.get_data(as_text=True)
    accept_seconds = time.perf_counter() - started
    job = accepted.get_json()["id"]
    batch = app.settings.batch_size
    while run_batch(app, limit=batch):
        pass
    seconds = time.perf_counter() - started
    progress = client.get(f"/bulk/{job}").get_json()
    assert progress["state"] == "finished" and progress["done"] == expect, progress
    return {
        "labels": expect,
        "batch_size": batch,
        "accept_seconds": round(accept_seconds, 2),
        "seconds": round(seconds, 2),
        "labels_per_second": round(expect / seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=int, action="append", help="table sizes (repeatable)")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--bulk", type=int, default=10_000, help="errored labels to retry")
    args = parser.parse_args()
    for count in args.labels or [100_000]:
        print(json.dumps(measure(count, args.repeat, args.bulk), indent=2), flush=True)


if __name__ == "__main__":
    main()
