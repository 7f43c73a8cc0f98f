"""Writes of many label rows leave the planner's statistics true, autovacuum or not.

The labels here are written by SQL without a next check (a backfill, an
upgrade), then scheduled as ``routemaster migrate -c`` and the worker do;
autovacuum is kept off the table, as it is on a server that runs without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from routemaster.app import App
from routemaster.cli import cli
from routemaster.config import load_config
from routemaster.db import table_statistics
from routemaster.service.scheduling import schedule_unscheduled

LABELS = 20_000

CONFIG = """
state_machines:
  m:
    states:
      - gate: waiting
        triggers: [{event: timer}]
        exit_condition: metadata.go = true or 1h has passed since history.entered_state
        next: done
      - gate: done
        exit_condition: false
"""


@pytest.fixture
def stale(db_engine: sa.Engine) -> Iterator[sa.Engine]:
    """``LABELS`` labels written by SQL after the table's last ANALYZE, none scheduled yet;
    the server told at once of the rows written (a backend's counts otherwise follow within
    about a second)."""
    with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ALTER TABLE labels SET (autovacuum_enabled = false)")
        conn.exec_driver_sql("ANALYZE labels")
    with db_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id,"
                " name_key, shard_key) SELECT 'm', 'n' || i, 'waiting', now(), 0,"
                " routemaster_label_key('n' || i), routemaster_shard_key('n' || i)"
                " FROM generate_series(1, :n) AS i"
            ),
            {"n": LABELS},
        )
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
    assert _believed(db_engine, "labels") == 0  # what the planner believes: an empty table
    yield db_engine
    with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ALTER TABLE labels RESET (autovacuum_enabled)")


def _believed(engine: sa.Engine, relation: str) -> float:
    """The rows the planner believes ``relation`` holds (none for a table never analysed)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:r)"), {"r": relation}
        ).scalar_one()
    return max(float(rows), 0.0)


def _unscheduled(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        query = "SELECT count(*) FROM labels WHERE scheduled_at IS DISTINCT FROM updated_at"
        return int(conn.execute(sa.text(query)).scalar_one())


def test_migrate_scheduling_many_labels_leaves_the_statistics_true(
    stale: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    env = {"DATABASE_URL": database_url, "DB_HOST": None, "DB_NAME": None}
    result = CliRunner().invoke(cli, ["-c", str(config), "migrate"], env=env)
    assert result.exit_code == 0, result.output
    assert f"Computed the next checks of {LABELS} labels." in result.stderr
    assert _unscheduled(stale) == 0
    # the table and the claim's index as they are now: every label due, claimable
    assert _believed(stale, "labels") == pytest.approx(LABELS, rel=0.05)
    assert _believed(stale, "labels_claimable") == pytest.approx(LABELS, rel=0.05)
    with stale.connect() as conn:
        due_at_unknown = conn.execute(
            sa.text(
                "SELECT null_frac FROM pg_stats WHERE tablename = 'labels' AND attname = 'due_at'"
            )
        ).scalar_one()
    assert due_at_unknown == 0


def test_the_workers_backfill_in_small_batches_leaves_the_statistics_true(
    stale: sa.Engine, direct_engine: sa.Engine | None, tmp_path: Path
) -> None:
    """Each batch is far below ``ANALYZE_AFTER``: the server's count of the rows changed
    since the last ANALYZE decides, as autovacuum would."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    app = App(config=load_config([config]), db=stale, direct=direct_engine)
    try:
        while schedule_unscheduled(app, limit=500):
            pass
    finally:
        app.http.close()
    assert _unscheduled(stale) == 0
    assert _believed(stale, "labels") == pytest.approx(LABELS, rel=0.05)


def test_a_few_rows_are_left_to_autovacuum_and_many_are_analysed_at_once(
    db_engine: sa.Engine,
) -> None:
    with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE labels")
    assert table_statistics.refresh(db_engine, {"labels": 10, "history": 0}) == []
    many = {"labels": table_statistics.ANALYZE_AFTER, "history": 0}
    assert table_statistics.refresh(db_engine, many) == ["labels"]
