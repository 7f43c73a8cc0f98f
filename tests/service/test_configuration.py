"""``plan`` and the start-up check count labels only in the states that matter to them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db import occupied_states
from routemaster.service.configuration import current_plan, record_configuration, stranding_plan

OLD = """
state_machines:
  order:
    states:
      - gate: pending
        exit_condition: false
        next:
          type: context
          path: metadata.cancel
          default: done
          destinations: [{value: true, state: cancelled}]
      - gate: cancelled
        exit_condition: false
      - gate: done
        exit_condition: false
"""

NEW = """
state_machines:
  order:
    states:
      - gate: awaiting_payment
        exit_condition: false
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - rename: {from: pending, to: awaiting_payment}
"""


def _app(tmp_path: Path, name: str, text: str, engine: sa.Engine) -> App:
    path = tmp_path / name
    path.write_text(text)
    return App(config=load_config([path]), db=engine)


def _insert(engine: sa.Engine, state: str, count: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id,"
                " name_key, shard_key)"
                " SELECT 'order', :state || g, :state, now(), 1,"
                " routemaster_label_key(:state || g), routemaster_shard_key(:state || g)"
                " FROM generate_series(1, :count) AS g"
            ),
            {"state": state, "count": count},
        )


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """Every statement run on ``engine`` meanwhile, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(*args: Any) -> None:
        seen.append((str(args[2]), args[3]))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def _counted(seen: list[tuple[str, Any]]) -> list[str]:
    """The states whose labels were counted; no other statement read labels but the probes."""
    reading = [(text, params) for text, params in seen if "FROM labels" in text]
    probes = (occupied_states._NEXT_OCCUPIED, occupied_states._OTHER_VERSIONS)
    assert all(text in (*probes, occupied_states._IN_STATE_BY_VERSION) for text, _ in reading), (
        reading
    )
    return [params["state"] for text, params in reading if text not in probes]


def test_plan_counts_only_the_states_that_change(tmp_path: Path, db_engine: sa.Engine) -> None:
    record_configuration(_app(tmp_path, "old.yaml", OLD, db_engine))
    _insert(db_engine, "done", 500)  # unchanged: never counted
    _insert(db_engine, "pending", 3)  # renamed
    _insert(db_engine, "cancelled", 2)  # removed with no migration: stranded
    new = _app(tmp_path, "new.yaml", NEW, db_engine)
    with _statements(db_engine) as seen:
        plan = current_plan(new)
    assert sorted(_counted(seen)) == ["cancelled", "pending"]
    (machine,) = plan.machines
    assert {state.name: state.labels for state in machine.states} == {
        "done": None,  # holds labels, not counted
        "pending": 3,
        "cancelled": 2,
    }
    assert plan.stranded == (("order", "cancelled", 2),)


def test_the_start_up_check_counts_only_states_that_would_strand_labels(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    record_configuration(_app(tmp_path, "old.yaml", OLD, db_engine))
    _insert(db_engine, "done", 500)
    _insert(db_engine, "pending", 3)  # a migration takes them: nothing to count
    new = _app(tmp_path, "new.yaml", NEW, db_engine)
    with _statements(db_engine) as seen:
        assert not stranding_plan(new).strands_labels
    assert _counted(seen) == []
    probes = [text for text, _ in seen if text == occupied_states._NEXT_OCCUPIED]
    assert len(probes) == 3  # one per state that holds labels, and the last finds none

    _insert(db_engine, "cancelled", 2)
    with _statements(db_engine) as seen:
        plan = stranding_plan(new)
    assert _counted(seen) == ["cancelled"]
    assert plan.stranded == (("order", "cancelled", 2),)
