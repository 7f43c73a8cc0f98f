"""The action drain, in one process, for two checkouts turn about: labels/s and CPU per label.

    python bench/drain_inprocess.py --trees /path/to/before,/path/to/after [--labels 3000]
                                    [--rounds 4]

Each round runs every tree once, alternating: a fresh table of ``--labels``
labels due in an action (bulk-inserted), one worker (``Worker`` in a thread,
default settings) delivering to ``bench/receiver.py``, timed until every label
has left the action. Reported per run: labels/s and the worker process's CPU
time per label (all its threads), which the machine's other load disturbs
less than wall time. Needs a PostgreSQL server it may create a database on
(``DATABASE_URL``, else ``postgres@127.0.0.1:5432``); both trees must read
the database the newer one migrated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ONE_RUN = """
import sys, threading, time
from pathlib import Path
import sqlalchemy as sa
from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.db.plumbing.database import create_engine
from routemaster.worker import Worker

labels, config, url = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
engine = create_engine(url, pool_size=5, max_overflow=30)
app = App(config=load_config([config]), db=engine, settings=Settings(poll_interval=0.5))
with engine.begin() as conn:
    conn.execute(sa.text("TRUNCATE labels, history"))
    conn.execute(sa.text(
        "WITH h AS (INSERT INTO history (state_machine, label, old_state, new_state, created,"
        " shard_key)"
        " SELECT 'flow', 'l' || g, NULL, 'notify', now(), routemaster_shard_key('l' || g)"
        " FROM generate_series(1, :n) g"
        " RETURNING id, label, shard_key)"
        " INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id,"
        " due_at, name_key, shard_key) SELECT 'flow', label, '{}', 'notify', now(), id, now(),"
        " routemaster_label_key(label), shard_key FROM h"), {"n": labels})
worker = Worker(app)
thread = threading.Thread(target=worker.run, daemon=True)
started, cpu = time.monotonic(), time.process_time()
thread.start()
while True:
    with engine.connect() as conn:
        if not conn.execute(sa.text("SELECT count(*) FROM labels WHERE state = 'notify'")).scalar():
            break
    time.sleep(0.05)
elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
worker.stop()
thread.join(10)
print(f"{labels / elapsed:.1f} {cpu / labels * 1e6:.1f}")
"""

CONFIG = """
state_machines:
  flow:
    states:
      - action: notify
        webhook: http://127.0.0.1:{port}/ok
        next: end
      - gate: end
        exit_condition: false
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trees", required=True, help="comma-separated checkouts")
    parser.add_argument("--labels", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--port", type=int, default=18322)
    args = parser.parse_args()
    trees = [Path(tree).resolve() for tree in args.trees.split(",")]

    from scratch import ScratchDatabase

    scratch = ScratchDatabase(f"bench_drain_{os.getpid()}")
    url = scratch.url
    receiver = subprocess.Popen(
        [sys.executable, str(HERE / "receiver.py"), "--port", str(args.port)]
    )
    results: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in trees}
    try:
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(trees[-1])}
        subprocess.run(
            [sys.executable, "-m", "routemaster", "migrate"],
            env=env,
            check=True,
            capture_output=True,
        )
        config = Path(tempfile.mkdtemp(prefix="drain-")) / "drain.yaml"
        config.write_text(CONFIG.format(port=args.port))
        for round_number in range(args.rounds):
            for tree in trees:
                out = subprocess.run(
                    [sys.executable, "-c", ONE_RUN, str(args.labels), str(config), url],
                    env={**os.environ, "PYTHONPATH": str(tree)},
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=600,
                )
                rate, cpu = map(float, out.stdout.split()[-2:])
                results[tree].append((rate, cpu))
                print(
                    f"round {round_number + 1} {tree}: {rate:.0f} labels/s, {cpu:.0f} us CPU/label"
                )
    finally:
        receiver.terminate()
        receiver.wait()
        scratch.drop()
    for tree, runs in results.items():
        rates = [rate for rate, _ in runs]
        cpus = [cpu for _, cpu in runs]
        print(
            f"{tree}: median {statistics.median(rates):.0f} labels/s, "
            f"{statistics.median(cpus):.0f} us CPU/label over {len(runs)} runs"
        )


if __name__ == "__main__":
    main()
