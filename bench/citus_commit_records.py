"""Commit records (two-phase commits) per write of one label, on a Citus cluster.

    python bench/citus_commit_records.py postgresql://root@127.0.0.1:9720/routemaster

Migrates the database named (a coordinator's, listing its workers), empties the label
tables, then makes each write of one label once: through the API (a Flask test client in
this process) and, for the worker's writes, through the store as the worker calls it. For
each, the commit records Citus added to ``pg_dist_transaction`` (one per worker a
transaction prepared on): 0 is a router transaction, committed on the label's worker in one
phase. Prints one line per write.
"""

from __future__ import annotations

import datetime
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db import labels, transitions
from routemaster.db.plumbing.database import create_engine
from routemaster.db.upgrade import upgrade
from routemaster.web import create_app

CONFIG = """
state_machines:
  user:
    states:
      - gate: start
        triggers: [{metadata: ready}]
        exit_condition: metadata.ready = true
        next: review
      - gate: review
        exit_condition: false
        next: notify
      - action: notify
        webhook: http://127.0.0.1:9/hooks/<label>
        next: done
      - gate: done
        exit_condition: false
"""
NOW = datetime.datetime(2026, 11, 28, 5, 0, tzinfo=datetime.UTC)
LABELS = "/state-machines/user/labels"


def main(url: str) -> None:
    engine = create_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE labels, history, tasks, deliveries, bulk_items"))
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder, "config.yaml")
        config.write_text(CONFIG)
        client = create_app(App(config=load_config([config]), db=engine)).test_client()

    def api(method: str, path: str, body: dict[str, object] | None = None) -> Callable[[], None]:
        def write() -> None:
            answer = client.open(f"{LABELS}/{path}", method=method, json=body)
            assert answer.status_code < 300, answer.get_data(as_text=True)

        return write

    def moved(*states: str) -> Callable[[], None]:
        def write() -> None:
            with engine.begin() as conn:
                label = labels.lock(conn, "user", "b")
                assert label is not None
                transitions.write_moves(conn, [labels.Moves(label, states, due_at=None)], now=NOW)

        return write

    def errored() -> None:
        with engine.begin() as conn:
            label = labels.lock(conn, "user", "b")
            assert label is not None
            transitions.become_errored(
                conn, [transitions.Erring("user", "b", label.entry_id, "boom")], now=NOW
            )

    writes = [
        ("create (API)", api("POST", "a", {"metadata": {}})),
        ("PATCH, no move (API)", api("PATCH", "a", {"metadata": {"n": 1}})),
        ("PATCH, move via gate (API)", api("PATCH", "a", {"metadata": {"ready": True}})),
        ("pause (API)", api("POST", "a/pause", {"reason": "hold"})),
        ("resume (API)", api("POST", "a/resume", {})),
        ("operator move (API)", api("POST", "a/move", {"state": "done", "reason": "ops"})),
        ("delete (API)", api("DELETE", "a")),
        ("create b (API)", api("POST", "b", {"metadata": {}})),
        ("move through two states (worker)", moved("review", "notify")),
        ("error (worker)", errored),
        ("retry (API)", api("POST", "b/retry", {"reason": "fixed"})),
        ("action success (worker)", moved("done")),
    ]
    for name, write in writes:
        with engine.connect() as conn:
            before = set(conn.execute(sa.text("SELECT gid FROM pg_dist_transaction")).scalars())
        write()
        with engine.connect() as conn:
            after = set(conn.execute(sa.text("SELECT gid FROM pg_dist_transaction")).scalars())
        print(f"{name:34s} commit records {len(after - before)}")
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
