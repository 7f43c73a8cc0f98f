"""Counts per state as the API and the console show them, through the service: exact through
creates, moves, forced moves and deletes, with workers folding at the same moments."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.service.changes import machine_overview
from routemaster.service.label_counts import fold_label_counts
from routemaster.service.listings import StateCount, state_counts
from tests.waiting import run_together

CONFIG = """
state_machines:
  user:
    states:
      - gate: start
        triggers:
          - metadata: ready
        exit_condition: metadata.ready = true
        next: review
      - gate: review
        exit_condition: metadata.approved = true
        next: done
      - gate: done
        exit_condition: false
"""


def _app(db_engine: sa.Engine, tmp_path: Path) -> App:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return App(config=load_config([path]), db=db_engine)


def test_counts_shown_stay_exact_while_workers_fold_at_the_same_moments(
    db_engine: sa.Engine, tmp_path: Path
) -> None:
    app = _app(db_engine, tmp_path)
    user = app.config.get_machine("user")
    for i in range(12):
        service.create_label(app, user, f"l{i}", {})
    for i in range(6):
        service.update_metadata(app, user, f"l{i}", {"ready": True})  # start -> review
    run_together(4, lambda _: fold_label_counts(app))  # four crons fold at once
    service.force_move(app, user, "l0", "done", reason="test")
    service.delete_label(app, user, "l11")
    assert state_counts(app, "user") == {
        "start": StateCount(5, 0),
        "review": StateCount(5, 0),
        "done": StateCount(1, 0),
    }
    folded = run_together(4, lambda _: fold_label_counts(app))
    assert sum(folded) == 2  # the forced move and the delete, once
    assert state_counts(app, "user") == {
        "start": StateCount(5, 0),
        "review": StateCount(5, 0),
        "done": StateCount(1, 0),
    }
    overview = machine_overview(app, user, recent=5, errored=5)
    assert overview.counts == state_counts(app, "user")
