"""Claims never read labels that cannot be claimed (SPEC F2): paused or errored overdue labels
cost a claim round nothing, however many there are, and are claimed again once resumed."""

from __future__ import annotations

import datetime
import uuid

import sqlalchemy as sa

from routemaster.db import claims, receiver_claims, task_claims, transitions
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

# Rows of labels this session has read and not yet reported to the statistics, by any scan
# (reported between transactions, never within one: read before and after in one).
_ROWS_READ = """
    SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
    WHERE relname = 'labels'
    """


def _fill(conn: sa.Connection, prefix: str, count: int, *, paused: bool, errored: bool) -> None:
    conn.exec_driver_sql(
        _FILL,
        {"prefix": prefix, "count": count, "now": NOW, "paused": paused, "errored": errored},
    )


def _rows_read(conn: sa.Connection) -> int:
    row = fetch_one(conn, _ROWS_READ)
    return 0 if row is None else int(row[0])


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
        before = _rows_read(conn)
        assert _claim_round(conn) == 3
        read = _rows_read(conn) - before
        transaction.rollback()
    # The three due labels, read by their claims and by the updates that lease them.
    assert read <= 20, f"{read} rows of labels read for 3 claimable ones"


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
            transitions.pause(conn, label, False, now=NOW, reason="resumed")
    with db_engine.begin() as conn:
        # 10 gates, 10 deliveries (up to 16) and 10 pull tasks (up to 10), due all along.
        assert _claim_round(conn) == 30
        assert claims.next_due_at(conn) is not None


def test_a_delivery_claim_reads_no_label_of_a_receiver_it_may_not_call(
    db_engine: sa.Engine,
) -> None:
    with db_engine.begin() as conn:
        _fill(conn, "held-", UNCLAIMABLE, paused=False, errored=False)
        conn.exec_driver_sql("UPDATE labels SET state = 'held-hook'")  # an open circuit's action
        _fill(conn, "due-", 3, paused=False, errored=False)
        conn.exec_driver_sql("ANALYZE labels")
    routes = [("r", "m", "hook"), ("open", "m", "held-hook")]
    with db_engine.connect() as conn, conn.begin() as transaction:
        before = _rows_read(conn)
        claimed = receiver_claims.claim(
            conn,
            [Wanted("r", 16)],  # "open" is not wanted: its circuit is open
            routes,
            free=16,
            now=NOW,
            lease_until=NOW + datetime.timedelta(minutes=1),
            worker_id="w",
        )
        read = _rows_read(conn) - before
        transaction.rollback()
    assert [item.receiver for item in claimed] == ["r"]
    assert read <= 10, f"{read} rows of labels read for 1 delivery"
