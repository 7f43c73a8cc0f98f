"""Child labels across real worker processes (SPEC G3): a worker killed while spawning
leaves each child created exactly once; children finishing together in several workers
make their parent decide once."""

from __future__ import annotations

import signal

import pytest

from routemaster import service
from routemaster.app import App
from tests.citus_cluster import citus_run
from tests.waiting import wait_until
from tests.worker.children import rows
from tests.worker.conftest import WorkersFor

pytestmark = pytest.mark.slow

MANY = """
state_machines:
  order:
    states:
      - spawn: pick
        machine: item
        for_each: metadata.items
        wait: {wait}
        next: done
      - gate: done
        exit_condition: false
  item:
    states:
      - gate: waiting
        exit_condition: true
        triggers:
          - event: entry
        next: picked
      - gate: picked
        exit_condition: false
        outcome: succeeded
"""


def _count(app: App, sql: str) -> int:
    return int(rows(app, sql)[0][0])


def test_a_worker_killed_while_spawning_leaves_each_child_created_once(
    workers_for: WorkersFor,
) -> None:
    workers, app = workers_for(
        MANY.format(wait="all").replace("exit_condition: true", "exit_condition: false")
    )
    first = workers.start()
    workers.wait_started()
    total = 6_000 if citus_run() else 30_000  # Citus spawns slower: a kill still lands halfway
    service.create_label(app, app.config.get_machine("order"), "o", {"items": list(range(total))})
    wait_until(
        lambda: _count(app, "SELECT count(*) FROM children") >= 1000, "a first batch", timeout=60
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    halfway = _count(app, "SELECT count(*) FROM children")
    assert 0 < halfway < total, "killed while spawning"
    workers.start()
    wait_until(
        lambda: _count(app, "SELECT count(*) FROM children") == total, "all spawned", timeout=120
    )
    assert rows(
        app,
        "SELECT count(*), count(DISTINCT position), min(position), max(position) FROM children",
    ) == [(total, total, 0, total - 1)]
    assert _count(app, "SELECT count(*) FROM labels WHERE state_machine = 'item'") == total
    created = "SELECT count(*) FROM history WHERE state_machine = 'item' AND old_state IS NULL"
    assert _count(app, created) == total
    assert rows(app, "SELECT spawned, total FROM spawns") == [(total, total)]


@pytest.mark.parametrize("wait", ["any", "{at_least: 150}"])
def test_children_finishing_together_in_three_workers_move_their_parent_once(
    workers_for: WorkersFor, wait: str
) -> None:
    workers, app = workers_for(MANY.format(wait=wait))
    for _ in range(3):
        workers.start(batch_size=20)
    workers.wait_started()
    order = app.config.get_machine("order")
    for index in range(5):
        service.create_label(app, order, f"o{index}", {"items": list(range(200))})
    wait_until(
        lambda: _count(app, "SELECT count(*) FROM labels WHERE state = 'done'") == 5,
        "every parent decided",
        timeout=120,
    )
    moves = rows(
        app,
        "SELECT label, count(*) FROM history WHERE state_machine = 'order'"
        " AND old_state = 'pick' GROUP BY label ORDER BY label",
    )
    assert moves == [(f"o{index}", 1) for index in range(5)]
    # Never early: when each parent moved, as many children had succeeded as it waited for.
    least = 1 if wait == "any" else 150
    position = "SELECT label, CAST(xact_id AS text), id FROM history WHERE {}"
    moved = rows(app, position.format("state_machine = 'order' AND old_state = 'pick'"))
    picked = rows(app, position.format("state_machine = 'item' AND new_state = 'picked'"))
    for parent, xact, entry in moved:
        before = [
            child
            for child, child_xact, child_entry in picked
            if child.startswith(f"{parent}/")
            and (int(child_xact), child_entry) < (int(xact), entry)
        ]
        assert len(before) >= least, (parent, len(before))
    logs = workers.logs()
    assert sum("Traceback" in log for log in logs) == 0, logs
