"""Real worker processes stopped mid-way: SIGTERM sends nothing new, SIGKILL leaves no hole in
the delivery log."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from routemaster.app import App
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import WorkersFor
from tests.worker.notify import create, notify_config

pytestmark = pytest.mark.slow


def rows(app: App, sql: str) -> list[tuple[Any, ...]]:
    with app.db.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(sql))]


def count(app: App, sql: str) -> int:
    with app.db.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def waiting_on_locks(app: App) -> int:
    """Statements of this database's sessions waiting for a lock another session holds."""
    return count(
        app,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )


def moved_without_delivered_entry(app: App) -> list[str]:
    """Labels that left the action with no ``delivered`` entry in the delivery log."""
    return [
        str(label)
        for (label,) in rows(
            app,
            "SELECT h.label FROM history h WHERE h.old_state = 'notify' AND NOT EXISTS"
            " (SELECT 1 FROM deliveries d WHERE d.label = h.label AND d.outcome = 'delivered')",
        )
    ]


def test_sigterm_while_a_round_waits_on_a_lock_sends_nothing_new(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    # A receiver with a limit: each claim locks its row first, so a lock held on it from
    # another connection holds the worker's round in the middle of its claim.
    workers, app = workers_for(notify_config(receiver="max_in_flight: 100"))
    stub.script("/hook/slow", Reply(200, delay=1.5))
    first = workers.start(delivery_concurrency=4)  # leases of 60 s, the default
    workers.wait_started()
    create(app, "slow")
    stub.wait_for(lambda: len(stub.received()) == 1)  # in flight when the signal comes
    names = [f"a{index}" for index in range(6)]
    with app.db.connect() as locker:
        locker.execute(sa.text("SELECT id FROM receivers FOR UPDATE"))
        create(app, *names)
        wait_until(lambda: waiting_on_locks(app), "the worker's claim waiting on the lock")
        signalled = time.monotonic()
        first.send_signal(signal.SIGTERM)
        locker.commit()  # the claim goes through, with the signal already received
    assert first.wait(timeout=15) == 0
    [log] = workers.logs()

    # No call started after the signal; the one in flight finished and was recorded.
    assert [(r.path, r.at < signalled) for r in stub.received()] == [("/hook/slow", True)]
    assert rows(app, "SELECT label, outcome FROM deliveries") == [("slow", "delivered")]
    assert rows(app, "SELECT state FROM labels WHERE name = 'slow'") == [("done",)]

    # What the interrupted claim took is due again now, with no attempt used and no lease.
    given_back = re.search(r"gave back (\d+) claimed labels not sent", log)
    assert given_back is not None and int(given_back[1]) >= 1, log
    waiting = rows(
        app,
        "SELECT name, state, attempts, lease_owner, due_at <= now() FROM labels"
        " WHERE name <> 'slow' ORDER BY name",
    )
    assert waiting == [(name, "notify", 0, None, True) for name in names]

    # So a second worker sends them at once, not after the first one's 60 s lease.
    workers.start()
    wait_until(
        lambda: count(app, "SELECT count(*) FROM labels WHERE state = 'done'") == 7,
        workers.logs,
        timeout=10,
    )
    calls = Counter(request.path for request in stub.received())
    assert calls == Counter({f"/hook/{name}": 1 for name in ["slow", *names]})


def test_sigkill_during_a_busy_drain_leaves_the_log_complete(
    workers_for: WorkersFor, stub: StubServer
) -> None:
    # Refusals of their own, each retried after a second, never enough to open the circuit.
    config = notify_config(
        retry="max_attempts: 5, initial_delay: 1s", receiver="circuit: {failures: 50}"
    )
    workers, app = workers_for(config)
    twice = [f"t{index:02}" for index in range(20)]  # refused once, then delivered
    once = [f"l{index:03}" for index in range(180)]
    for name in twice:
        stub.script(f"/hook/{name}", Reply(500), Reply(200, delay=0.3))
    for name in once:
        stub.script(f"/hook/{name}", Reply(200, delay=0.3))
    first = workers.start(lease=3)
    workers.wait_started()
    create(app, *twice)
    wait_until(
        lambda: count(app, "SELECT count(*) FROM deliveries WHERE outcome = 'failed'") == 20,
        "every first call refused and logged",
    )
    create(app, *once)
    wait_until(
        lambda: count(app, "SELECT count(*) FROM labels WHERE state = 'done'") >= 64,
        workers.logs,
        timeout=30,
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = time.monotonic()

    # At the moment of the kill, every label that had moved had its entry.
    assert moved_without_delivered_entry(app) == []
    # The kill came in the middle of the drain.
    assert count(app, "SELECT count(*) FROM labels WHERE state = 'done'") < 200

    second = workers.start(lease=3)
    wait_until(
        lambda: count(app, "SELECT count(*) FROM labels WHERE state = 'done'") == 200,
        workers.logs,
        timeout=60,
    )
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=15) == 0

    assert moved_without_delivered_entry(app) == []
    calls = Counter(request.path.removeprefix("/hook/") for request in stub.received())
    entries: dict[str, list[str]] = {}
    for label, outcome in rows(app, "SELECT label, outcome FROM deliveries ORDER BY id"):
        entries.setdefault(str(label), []).append(str(outcome))
    for name in once:
        assert entries[name] == ["delivered"], name  # one answered call, one entry
    for name in twice:  # a label called twice (and answered each time) shows both calls
        assert entries[name] == ["failed", "delivered"], (name, calls[name])
    # The calls the kill cut short had no answer, so no entry: they were sent again.
    cut_short = [
        name
        for name in once
        if calls[name] == 2
        and any(r.path == f"/hook/{name}" and r.at < killed_at for r in stub.received())
    ]
    assert cut_short, "some calls were in flight at the kill"
    assert all(calls[name] <= 2 for name in once)
