"""Bulk commands carried out by real worker processes, including one killed mid-batch."""

from __future__ import annotations

import signal

import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.db.search import Search
from routemaster.search import compile_search
from routemaster.service.bulk import BulkCommand, accept, get_job
from tests.waiting import wait_until
from tests.worker.conftest import WorkersFor

CONFIG = """
state_machines:
  orders:
    states:
      - gate: waiting
        exit_condition: false
"""
COUNT = 120


def _labels(app: App) -> None:
    machine = app.config.get_machine("orders")
    for index in range(COUNT):
        service.create_label(app, machine, f"o{index:03}", {"n": index})


def _pause_all(app: App) -> int:
    where = compile_search("metadata.n >= 0", app.now())
    command = BulkCommand(command="pause", reason="freeze", where="metadata.n >= 0")
    job, count = accept(app, Search("orders", where.sql, where.params), command, expect=COUNT)
    assert count == COUNT
    return job


def _waiting_on_a_lock(app: App) -> bool:
    with app.db.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return bool(conn.execute(sa.text(query)).scalar_one())


def _finished(app: App, job: int) -> bool:
    found = get_job(app, job)
    return found is not None and found.finished_at is not None


def _forced_entries(app: App) -> dict[str, int]:
    with app.db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT label, count(*) FROM history WHERE forced AND reason = 'freeze'"
                " GROUP BY label"
            )
        )
        return {label: count for label, count in rows}


def test_a_worker_killed_mid_batch_loses_its_batch_and_the_next_finishes_it_once_each(
    workers_for: WorkersFor,
) -> None:
    workers, app = workers_for(CONFIG)
    _labels(app)
    job = _pause_all(app)
    # Hold one label of the first batch, so the worker stops there with part of the batch changed.
    with app.db.connect() as holder:
        holder.execute(sa.text("BEGIN"))
        holder.execute(sa.text("SELECT 1 FROM labels WHERE name = 'o010' FOR UPDATE"))
        doomed = workers.start(batch_size=50)
        wait_until(lambda: _waiting_on_a_lock(app), "the worker never reached o010", timeout=20)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        holder.execute(sa.text("ROLLBACK"))
    # The killed worker's transaction is rolled back: nothing of its batch happened.
    wait_until(lambda: not _waiting_on_a_lock(app), "the dead worker's query lingers", timeout=20)
    progress = get_job(app, job)
    assert progress is not None and progress.done == 0
    assert _forced_entries(app) == {}
    workers.start(batch_size=50)
    wait_until(lambda: _finished(app, job), "the job did not finish", timeout=30)
    final = get_job(app, job)
    assert final is not None
    assert (final.total, final.done, final.skipped, final.failed) == (COUNT, COUNT, 0, 0)
    entries = _forced_entries(app)
    assert len(entries) == COUNT and set(entries.values()) == {1}, "each label changed once"
    with app.db.connect() as conn:
        paused = conn.execute(sa.text("SELECT count(*) FROM labels WHERE paused")).scalar_one()
    assert paused == COUNT


def test_two_workers_share_a_bulk_job_without_touching_a_label_twice(
    workers_for: WorkersFor,
) -> None:
    workers, app = workers_for(CONFIG)
    _labels(app)
    job = _pause_all(app)
    workers.start(batch_size=7)
    workers.start(batch_size=7)
    wait_until(lambda: _finished(app, job), "the job did not finish", timeout=30)
    final = get_job(app, job)
    assert final is not None and final.done == COUNT
    entries = _forced_entries(app)
    assert len(entries) == COUNT and set(entries.values()) == {1}
