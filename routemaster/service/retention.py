"""Retention's pruning run, a step of the worker's round: ``retention:`` for history, deleted
and finished labels; bulk jobs.

Every ``retention_interval`` each worker tries; one leads at a time, per
batch: each batch is one short transaction that first takes the leader's
transaction-scoped advisory lock (:func:`routemaster.db.retention.lead`)
and stops the run when another worker has it. A batch holds its rows for
milliseconds and skips labels the API has locked, so pruning never holds up
a request for longer than one batch, and never waits on one.

Then finished bulk jobs (``bulk_retention``) and the receiver slots of
worker processes long gone.

The order within a machine matters: finished labels are deleted first (a
history entry each, so streams see them go), deleted labels removed next
(their rows and all their history: the name is free again), history pruned
last. Each run does at most :data:`MAX_BATCHES` batches per kind and machine,
so a backlog is worked off over several runs rather than in one long one.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import NoNext, StateMachine
from routemaster.db import bulk, receivers, retention_progress, table_statistics, transitions
from routemaster.db import retention as store
from routemaster.service.label_counts import fold_label_counts
from routemaster.service.transactions import writing

logger = logging.getLogger(__name__)

BATCH = 1_000  # rows per transaction
MAX_BATCHES = 50  # per kind and machine in one run
SLOTS_KEPT = datetime.timedelta(days=1)  # a receiver slot this long expired: its worker is gone


@dataclass
class RunReport:
    """What one run did, per table; ``led`` is false when another worker was leading."""

    led: bool = True
    rows: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, rows: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + rows


class _NotLeader(Exception):
    """Another worker holds the pruning lock: this run stops."""


def prune(app: App, *, now: datetime.datetime | None = None) -> RunReport:
    """One pruning run over every machine's ``retention`` and finished bulk jobs."""
    now = app.now() if now is None else now
    report = RunReport()
    fold_label_counts(app)  # history it removes is counted first (routemaster.db.label_counts)
    try:
        for machine in app.config.state_machines:
            _machine(app, machine, now, report)
        _bulk_jobs(app, now, report)
        _receiver_slots(app, now, report)
    except _NotLeader:
        report.led = False
    rows = report.rows
    written = {
        "labels": rows.get("labels_finished", 0) + rows.get("labels", 0),
        "history": rows.get("labels_finished", 0) + rows.get("history", 0),
    }
    table_statistics.refresh(app.db, written, direct=app.direct)
    if any(report.rows.values()):
        logger.info("retention pruned %s", ", ".join(f"{n} {t}" for t, n in report.rows.items()))
    return report


def _machine(app: App, machine: StateMachine, now: datetime.datetime, report: RunReport) -> None:
    retention = machine.retention
    name = machine.name
    if retention.finished is not None:
        ends = [state.name for state in machine.states if isinstance(state.next_states, NoNext)]
        if ends:
            cutoff = now - retention.finished

            def finish(conn: sa.Connection) -> int:
                count = transitions.delete_finished(
                    conn, name, ends, cutoff=cutoff, now=now, batch=BATCH
                )
                _record(conn, "labels_finished", count, now, cutoff)
                return count

            report.add("labels_finished", _batches(app, finish))
    if retention.deleted is not None:
        cutoff = now - retention.deleted

        def remove(conn: sa.Connection) -> int:
            pruned = store.remove_deleted(conn, name, cutoff=cutoff, batch=BATCH)
            store.count_lost(conn, name, pruned.removed)
            _record(conn, "labels", pruned.labels, now, cutoff)
            _record(conn, "history", len(pruned.removed), now, None)
            report.add("history", len(pruned.removed))
            return pruned.labels

        report.add("labels", _batches(app, remove))
    if retention.history is not None:
        cutoff = now - retention.history

        def prune_history(conn: sa.Connection) -> int:
            pruned = store.prune_history(conn, name, cutoff=cutoff, batch=BATCH)
            store.count_lost(conn, name, pruned.removed)
            _record(conn, "history", len(pruned.removed), now, cutoff)
            report.add("history", len(pruned.removed))
            return pruned.scanned

        _batches(app, prune_history)


def _bulk_jobs(app: App, now: datetime.datetime, report: RunReport) -> None:
    cutoff = now - app.settings.bulk_retention

    def forget(conn: sa.Connection) -> int:
        items, jobs = bulk.forget_finished(conn, before=cutoff, limit=BATCH)
        _record(conn, "bulk_items", items, now, cutoff)
        _record(conn, "bulk_jobs", jobs, now, cutoff)
        report.add("bulk_items", items)
        report.add("bulk_jobs", jobs)
        return items + jobs

    _batches(app, forget)


def _receiver_slots(app: App, now: datetime.datetime, report: RunReport) -> None:
    cutoff = now - SLOTS_KEPT

    def forget(conn: sa.Connection) -> int:
        count = receivers.forget_expired_slots(conn, before=cutoff, limit=BATCH)
        _record(conn, "receiver_slots", count, now, cutoff)
        report.add("receiver_slots", count)
        return count

    _batches(app, forget)


def _batches(app: App, batch: Callable[[sa.Connection], int]) -> int:
    """Run ``batch`` in its own transaction, as leader, until it does less than a full batch."""
    total = 0
    for _ in range(MAX_BATCHES):
        with writing(app) as conn:
            if not store.lead(conn):
                raise _NotLeader()
            done = batch(conn)
        total += done
        if done < BATCH:
            break
    return total


def _record(
    conn: sa.Connection,
    table: str,
    rows: int,
    now: datetime.datetime,
    horizon: datetime.datetime | None,
) -> None:
    if rows or horizon is not None:
        retention_progress.record_progress(conn, table, rows=rows, now=now, horizon=horizon)
