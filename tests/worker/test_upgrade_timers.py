"""Exact timers (SPEC E1) on a ``continue`` machine (SPEC E4): each label by its own version.

A label created under version 1 waits in version 1's gate: its next check
and due time are solved from that gate's condition and triggers, whichever
process computes them (creating it, updating it, backfilling its row), and
a worker of version 2 moves it when version 1 says, firing version 1's clock
trigger as well as its own. A :class:`FakeClock` drives the processes.
"""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.service.scheduling import explain_next_check, schedule_unscheduled
from routemaster.worker import Worker
from tests.worker.conftest import FakeClock
from tests.worker.test_upgrade_strategies import Deployment, deployment  # noqa: F401
from tests.worker.test_worker_gates import one_round, states

UTC = datetime.UTC
NOON = datetime.datetime(2024, 7, 1, 12, 0, 30, tzinfo=UTC)

TIMED = """
state_machines:
  m:
    upgrade_strategy: continue
    states:
      - gate: start
        triggers: [{interval: %s}]
        exit_condition: %s has passed since history.entered_state
        next: done
      - gate: done
        exit_condition: false
"""
V1 = TIMED % ("1m", "1h")
V2 = TIMED % ("2m", "2h")


def at(hour: int, minute: int, second: int = 0) -> datetime.datetime:
    return datetime.datetime(2024, 7, 1, hour, minute, second, tzinfo=UTC)


def due_times(app: App) -> dict[str, tuple[datetime.datetime | None, datetime.datetime | None]]:
    """Each label's (next check, due time) as stored."""
    with app.db.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, next_check_at, due_at FROM labels")).all()
    return {row.name: (row.next_check_at, row.due_at) for row in rows}


def test_each_label_of_a_continue_machine_is_due_and_moves_by_its_own_versions_gate(
    deployment: Deployment,  # noqa: F811
) -> None:
    clock = FakeClock(NOON)
    old = deployment.start(V1)
    old.clock = clock
    service.create_label(old, old.config.get_machine("m"), "a", {})
    new = deployment.start(V2)
    new.clock = clock
    machine = new.config.get_machine("m")
    service.create_label(new, machine, "b", {})
    # v1: held from 13:00:30, first 1m occurrence 13:01; v2: from 14:00:30, 2m occurrence 14:02.
    expected = {"a": (at(13, 0, 30), at(13, 1)), "b": (at(14, 0, 30), at(14, 2))}
    assert due_times(new) == expected

    # An update through the new process keeps the old label on version 1's schedule.
    clock.current = at(12, 30)
    service.update_metadata(new, machine, "a", {"seen": True})
    assert due_times(new) == expected
    a = service.get_label(new, machine, "a")
    check = explain_next_check(new, machine, a)
    assert check is not None and check.at == at(13, 0, 30)

    # A row written without a schedule (an older release, a rename) is backfilled by version 1.
    with new.db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE labels SET next_check_at = NULL, due_at = NULL, scheduled_at = NULL"
                " WHERE name = 'a'"
            )
        )
    assert schedule_unscheduled(new, limit=10) == 1
    assert due_times(new) == expected

    worker = Worker(new)  # version 2's worker, running version 1's labels too
    assert {s.key for s in worker.triggers.triggers} == {"m/start/0", "m/start/0@v1"}
    clock.current = at(13, 0, 59)
    one_round(worker)
    assert states(new) == {"a": "start", "b": "start"}
    clock.current = at(13, 1)
    one_round(worker)
    assert states(new) == {"a": "done", "b": "start"}, "a moves by version 1's 1h and 1m"
    clock.current = at(14, 1)  # b's condition holds, but version 2's trigger fires at 14:02
    one_round(worker)
    assert states(new) == {"a": "done", "b": "start"}
    clock.current = at(14, 2)
    one_round(worker)
    assert states(new) == {"a": "done", "b": "done"}
