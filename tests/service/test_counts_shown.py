"""Counts per state as the API and the console show them, through the service: exact through
creates, moves, forced moves and deletes, with workers folding at the same moments."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.service.label_counts import fold_label_counts
from routemaster.service.reads import StateCount, state_counts
from routemaster.service.snapshots import machine_overview
from tests.waiting import run_together, wait_until

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
    folded = [sum(run_together(4, lambda _: fold_label_counts(app)))]  # four crons at once
    service.force_move(app, user, "l0", "done", reason="test")
    service.delete_label(app, user, "l11")
    expected = {
        "start": StateCount(5, 0),
        "review": StateCount(5, 0),
        "done": StateCount(1, 0),
    }
    assert state_counts(app, "user") == expected

    def everything_folded() -> bool:
        folded.append(sum(run_together(4, lambda _: fold_label_counts(app))))
        assert state_counts(app, "user") == expected
        return sum(folded) >= 20

    # 12 creates, 6 moves, a forced move and a delete: each history row folded once (on Citus
    # a fold goes as far as the horizon the workers last confirmed: it may take a few).
    wait_until(everything_folded, "every change folded", timeout=30, every=0.05)
    assert sum(folded) == 20
    overview = machine_overview(app, user, recent=5, errored=5)
    assert overview.counts == expected
