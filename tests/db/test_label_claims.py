"""Claims of labels (routemaster.db.label_claims) never read labels that cannot be claimed
(SPEC F2): each names the predicate of the claimable indexes, so paused or errored overdue labels
cost a claim round nothing, however many there are, and are claimed again once resumed."""

from __future__ import annotations

import datetime
import uuid

import pytest
import sqlalchemy as sa

from routemaster.db import label_claims, schema, transitions
from routemaster.db import labels as store
from routemaster.db.label_claims import Wanted
from routemaster.db.statements import fetch_one
from routemaster.db.tasks import Lease
from tests.db.test_statement_text import STATEMENTS

NOW = datetime.datetime.now(datetime.UTC)
UNCLAIMABLE = 3000
# The statements of routemaster.db.label_claims, by name.
LABEL_CLAIMS = {
    name.split(".")[1]: sql for name, sql in STATEMENTS if name.startswith("label_claims.")
}

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
    gates = label_claims.lock_due_gates(conn, [("m", "gate")], limit=500, now=NOW)
    deliveries = label_claims.claim_deliveries(
        conn,
        [Wanted("r", 16)],
        [("r", "m", "hook")],
        free=16,
        now=NOW,
        lease_until=later,
        worker_id="w",
    )
    tasks = label_claims.claim_tasks(
        conn,
        [("m", "pull", Lease(30, "fixed", 0))],
        ids=[uuid.uuid4().hex for _ in range(10)],
        worker="w",
        now=NOW,
    )
    label_claims.next_due_at(conn)
    return len(gates) + len(deliveries) + len(tasks)


# Every statement that reads due labels to claim them (or to find when the next falls due).
CLAIMS_OF_DUE_LABELS = [
    "_LOCK_GATES",
    "_DUE_GATE_KEYS",
    "_CLAIM_DELIVERIES",
    "_CLAIM_DELIVERIES_PLAIN",
    "_DUE_DELIVERY_KEYS",
    "_CLAIM_TASKS",
    "_AWAITING_KEYS",
    "_NEXT_DUE",
]


# Claims of labels already leased (run-out pull leases: index labels_leased), which may be paused.
CLAIMS_OF_LEASED_LABELS = ["_LOCK_EXPIRED", "_EXPIRED_KEYS"]

# Sweeps: labels picked for upkeep by another mark than being due (a pause's end, a schedule
# never computed, due too long ago), locked for one transaction and never leased.
SWEEPS = ["_LOCK_ENDED", "_LOCK_UNSCHEDULED", "_STALE"]


def test_every_claim_of_due_labels_is_checked() -> None:
    picking = {
        name
        for name, value in LABEL_CLAIMS.items()
        if "SKIP LOCKED" in value or "due_at <=" in value
    }
    assert picking == set(CLAIMS_OF_DUE_LABELS + CLAIMS_OF_LEASED_LABELS + SWEEPS) - {"_NEXT_DUE"}


def _predicate(index_name: str) -> str:
    """An index's partial predicate as SQL, without the table's name."""
    (index,) = [index for index in schema.labels.indexes if index.name == index_name]
    where = index.dialect_options["postgresql"]["where"]
    return " ".join(str(where).replace("labels.", "").split())


@pytest.mark.parametrize("index", ["labels_due", "labels_claimable"])
@pytest.mark.parametrize("name", CLAIMS_OF_DUE_LABELS)
def test_each_claim_names_the_claimable_indexes_predicate(index: str, name: str) -> None:
    """What is claimable is written once (the indexes of migration 0019); each claim's
    statement carries it whole, or PostgreSQL could not read those partial indexes."""
    predicate = _predicate(index)
    assert predicate.startswith("due_at IS NOT NULL AND ")
    claimable = predicate.removeprefix("due_at IS NOT NULL AND ")
    statement = " ".join(LABEL_CLAIMS[name].replace("labels.", "").split())
    assert claimable in statement, f"{name} lacks {claimable!r}"


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
        assert label_claims.next_due_at(conn) is not None


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
        claimed = label_claims.claim_deliveries(
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
