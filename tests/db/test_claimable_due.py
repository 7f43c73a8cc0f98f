"""Claims never read labels that cannot be claimed (SPEC F2): paused or errored overdue labels
cost a claim round nothing, however many there are, and are claimed again once resumed."""

from __future__ import annotations

import datetime
import uuid

import sqlalchemy as sa

from routemaster.db import claims, receiver_claims, task_claims
from routemaster.db import labels as store
from routemaster.db.receiver_claims import Wanted
from routemaster.db.statements import fetch_one
from routemaster.db.tasks import Lease

NOW = datetime.datetime.now(datetime.UTC)
UNCLAIMABLE = 3000

# Labels straight into a gate, a webhook action and a pull action, all overdue.
_FILL = """
    INSERT INTO labels (state_machine, name, name_key, shard_key, state, metadata, due_at,
                        state_entered_at, entry_id, paused, errored)
    SELECT 'm', %(prefix)s || i, convert_to(%(prefix)s || i, 'UTF8'),
           routemaster_shard_key(%(prefix)s || i),
           (ARRAY['gate', 'hook', 'pull'])[i %% 3 + 1], '{}',
           %(now)s - interval '1 hour' - i * interval '1 ms', %(now)s, i,
           %(paused)s, %(errored)s
    FROM generate_series(1, %(count)s) AS i
    """

# Rows of labels this transaction has read so far, by any scan (transaction-local counters).
_ROWS_READ = """
    SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
    WHERE relname = 'labels'
    """


def _fill(conn: sa.Connection, prefix: str, count: int, *, paused: bool, errored: bool) -> None:
    conn.exec_driver_sql(
        _FILL,
        {"prefix": prefix, "count": count, "now": NOW, "paused": paused, "errored": errored},
    )


def _claim_round(conn: sa.Connection) -> int:
    """What a worker's round claims (due gates, deliveries, pull tasks), and when work is
    next due; how many labels it took."""
    later = NOW + datetime.timedelta(minutes=1)
    gates = claims.lock_due_gates(conn, [("m", "gate")], limit=500, now=NOW)
    deliveries = receiver_claims.claim(
        conn,
        [Wanted("r", 16)],
        [("r", "m", "hook")],
        free=16,
        now=NOW,
        lease_until=later,
        worker_id="w",
    )
    tasks = task_claims.claim(
        conn,
        [("m", "pull", Lease(30, "fixed", 0))],
        ids=[uuid.uuid4().hex for _ in range(10)],
        worker="w",
        now=NOW,
    )
    claims.next_due_at(conn)
    return len(gates) + len(deliveries) + len(tasks)


def test_a_claim_round_reads_no_paused_or_errored_label(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        _fill(conn, "paused-", UNCLAIMABLE, paused=True, errored=False)
        _fill(conn, "errored-", UNCLAIMABLE, paused=False, errored=True)
        _fill(conn, "due-", 3, paused=False, errored=False)  # one in each state
        conn.exec_driver_sql("ANALYZE labels")
    with db_engine.connect() as conn, conn.begin() as transaction:
        assert _claim_round(conn) == 3
        row = fetch_one(conn, _ROWS_READ)
        transaction.rollback()
    assert row is not None
    # The three due labels, read by their claims and by the updates that lease them.
    assert row[0] <= 20, f"{row[0]} rows of labels read for 3 claimable ones"
    assert row[0] < UNCLAIMABLE


def test_resumed_labels_are_claimed_again(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        _fill(conn, "paused-", 30, paused=True, errored=False)
    with db_engine.connect() as conn, conn.begin() as transaction:
        assert _claim_round(conn) == 0
        transaction.rollback()
    with db_engine.begin() as conn:
        for number in range(1, 31):
            label = store.lock(conn, "m", f"paused-{number}")
            assert label is not None and label.paused
            store.set_paused(conn, label, False, now=NOW)
    with db_engine.begin() as conn:
        # 10 gates, 10 deliveries (up to 16) and 10 pull tasks (up to 10), due all along.
        assert _claim_round(conn) == 30
        assert claims.next_due_at(conn) is not None
