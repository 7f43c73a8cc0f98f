"""How long ``routemaster -c CONFIG plan --json`` takes against a database of many labels.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/plan.py [--labels 100000] [--runs 5]

Creates a scratch database on that server (dropped afterwards), migrates it,
records a configuration of three machines with ``migrate -c``, inserts the
labels spread over their states, then times the real command (a new process
each run, as an operator runs it: start-up included) against a changed
configuration (a rename, a removed state with a move, a changed webhook), and
the planning alone in-process. The target (issue 21): under 2 s at 100,000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scratch import ScratchDatabase  # noqa: E402

from routemaster.app import App  # noqa: E402
from routemaster.config import load_config  # noqa: E402
from routemaster.service.configuration import current_plan  # noqa: E402

MACHINE = """
  {name}:
    states:
      - gate: {first}
        triggers: [{{metadata: paid}}]
        exit_condition: metadata.paid
        next:
          type: context
          path: metadata.cancel
          default: notify
          destinations: [{{value: true, state: {other}}}]
      - action: notify
        webhook: http://127.0.0.1:9/{hook}/<label>
        next: done
      - gate: {other}
        exit_condition: false
        next: done
      - gate: done
        exit_condition: false
"""

OLD = "state_machines:" + "".join(
    MACHINE.format(name=f"m{i}", first="pending", other="cancelled", hook="notify")
    for i in range(3)
)
NEW = "state_machines:" + "".join(
    MACHINE.format(name=f"m{i}", first="awaiting", other="review", hook="notify/v2")
    + "    migrations:\n"
    + "      - rename: {from: pending, to: awaiting}\n"
    + "      - move: {from: cancelled, to: review}\n"
    for i in range(3)
)

INSERT = """
    INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id, name_key,
                        shard_key)
    SELECT 'm' || (i % 3), 'label-' || i,
           (ARRAY['pending', 'notify', 'cancelled', 'done'])[1 + (i / 3) % 4], now(), i,
           routemaster_label_key('label-' || i), routemaster_shard_key('label-' || i)
    FROM generate_series(1, :count) AS i
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    scratch = ScratchDatabase(f"routemaster_plan_bench_{uuid.uuid4().hex[:8]}")
    try:
        run(scratch.url, options.labels, options.runs)
    finally:
        scratch.drop()


def run(url: str, labels: int, runs: int) -> None:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "routemaster"]
    with tempfile.TemporaryDirectory() as directory:
        old, new = Path(directory, "old.yaml"), Path(directory, "new.yaml")
        old.write_text(OLD)
        new.write_text(NEW)
        subprocess.run([*command, "-c", str(old), "migrate"], env=env, check=True)
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(sa.text(INSERT), {"count": labels})
            conn.execute(sa.text("ANALYZE labels"))
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            done = subprocess.run(
                [*command, "-c", str(new), "plan", "--json"], env=env, capture_output=True
            )
            times.append(time.perf_counter() - started)
            assert done.returncode == 0, done.stderr
        app = App(config=load_config([new]), db=engine)
        inside = []
        for _ in range(runs):
            started = time.perf_counter()
            current_plan(app)
            inside.append(time.perf_counter() - started)
        engine.dispose()
    print(f"labels: {labels:,}")
    print(
        f"plan --json (new process each run): median {statistics.median(times):.3f} s,"
        f" max {max(times):.3f} s over {runs} runs"
    )
    median = statistics.median(inside) * 1000
    print(f"planning in-process (counts + comparison): median {median:.1f} ms")


if __name__ == "__main__":
    main()
