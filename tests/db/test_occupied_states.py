"""Which states hold labels, from the index: one entry read per state, whatever the labels."""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster.db import occupied_states, transitions
from routemaster.db.statements import fetch_all
from tests.citus_cluster import citus_run

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)


def _create(conn: sa.Connection, machine: str, name: str, state: str) -> None:
    assert transitions.insert(conn, machine, name, {}, state=state, now=NOW, due=False) is not None


def test_the_states_holding_live_labels_are_found_per_machine_in_order(
    db_engine: sa.Engine,
) -> None:
    with db_engine.begin() as conn:
        for i in range(30):
            _create(conn, "m", f"done-{i}", "done")
        _create(conn, "m", "one", "a")
        _create(conn, "other", "x", "z")
        _create(conn, "m", "gone", "b")
        conn.execute(sa.text("UPDATE labels SET deleted = true WHERE name = 'gone'"))
    with db_engine.connect() as conn:
        assert occupied_states.occupied(conn) == {"m": ["a", "done"], "other": ["z"]}
        assert occupied_states.in_state(conn, "m", "done") == {None: 30}
        assert occupied_states.in_state(conn, "m", "b") == {}  # the deleted label is not live


def test_each_step_reads_the_first_entry_of_the_index_after_the_last_state(
    db_engine: sa.Engine,
) -> None:
    """A LIMIT 1 along labels_by_state, never a read of the labels (on Citus: in each shard)."""
    with db_engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))  # the plan of many labels
        conn.execute(sa.text("SET LOCAL enable_sort = off"))
        plan = "\n".join(
            row[0]
            for row in fetch_all(
                conn, "EXPLAIN " + occupied_states._NEXT_OCCUPIED, {"sm": "m", "state": "a"}
            )
        )
    assert "labels_by_state" in plan, plan
    if citus_run():
        assert plan.count("Limit") == 2, plan  # the coordinator's, and each shard's
    else:
        assert plan.splitlines()[0].startswith("Limit"), plan
        assert "Index Only Scan using labels_by_state" in plan, plan
        assert "Sort" not in plan, plan
