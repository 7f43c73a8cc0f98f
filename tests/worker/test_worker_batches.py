"""The worker's batches: many labels decided in Python, written in one statement."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.db import labels as store
from routemaster.db.claimed import Claim
from routemaster.service.batch_moves import complete_deliveries
from tests.stub_server import running_stub

CONFIG = """
state_machines:
  order:
    states:
      - gate: waiting
        triggers:
          - interval: 1m
        exit_condition: metadata.go = true
        next: checking
      - gate: checking
        triggers:
          - event: entry
        exit_condition: metadata.express = true
        next: ship
      - action: ship
        webhook: http://127.0.0.1:9/ship
        next: done
      - gate: done
        exit_condition: false
"""


def _app(tmp_path: Path, db_engine: sa.Engine) -> App:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return App(config=load_config([path]), db=db_engine)


def _locked(conn: sa.Connection, *names: str) -> list[service.Label]:
    locked = [store.lock(conn, "order", name) for name in names]
    return [label for label in locked if label is not None]


def _delivered(app: App, *names: str) -> list[Claim]:
    """Claims as the worker holds them once their webhooks succeeded."""
    machine = app.config.get_machine("order")
    found = [service.get_label(app, machine, name) for name in names]
    return [
        Claim(label.state_machine, label.name, label.state, label.metadata, label.entry_id, 1)
        for label in found
    ]


def test_a_batch_moves_each_label_as_far_as_it_goes(tmp_path: Path, db_engine: sa.Engine) -> None:
    app = _app(tmp_path, db_engine)
    machine = app.config.get_machine("order")
    service.create_label(app, machine, "express", {"go": True, "express": True})
    service.create_label(app, machine, "normal", {"go": True})
    service.create_label(app, machine, "stuck", {"go": False})

    with app.db.begin() as conn:
        settled = service.settle_batch(
            conn, app, _locked(conn, "express", "normal", "stuck"), now=app.now()
        )

    assert [schedule.key for schedule in settled.unmoved] == [("order", "stuck")]
    assert settled.waiting == []

    express = service.get_label(app, machine, "express")
    assert (express.state, express.previous_state) == ("ship", "checking")
    assert express.due_at is not None  # the action is handed to the worker
    moves = [
        (entry.old_state, entry.new_state) for entry in service.history(app, machine, "express")
    ]
    assert moves == [(None, "waiting"), ("waiting", "checking"), ("checking", "ship")]
    assert express.entry_id == service.history(app, machine, "express")[-1].id

    normal = service.get_label(app, machine, "normal")
    assert (normal.state, normal.due_at) == ("checking", None)
    assert normal.entry_id == service.history(app, machine, "normal")[-1].id
    assert service.get_label(app, machine, "stuck").state == "waiting"


def test_delivered_actions_move_on_together_unless_moved_meanwhile(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    app = _app(tmp_path, db_engine)
    machine = app.config.get_machine("order")
    for name in ("a", "b", "c"):
        service.create_label(app, machine, name, {"go": True, "express": True})
        service.advance(app, machine, name)  # as the interval trigger would
    delivered = _delivered(app, "a", "b", "c")
    assert {claim.state for claim in delivered} == {"ship"}
    service.force_move(app, machine, "c", "waiting", reason="held back")

    assert complete_deliveries(app, delivered) == []

    for name in ("a", "b"):
        label = service.get_label(app, machine, name)
        assert (label.state, label.due_at) == ("done", None)
    assert service.get_label(app, machine, "c").state == "waiting"
    assert [e.new_state for e in service.history(app, machine, "c")][-1] == "waiting"


def test_a_delivered_action_followed_by_a_feed_reading_gate_goes_on(
    tmp_path: Path, db_engine: sa.Engine
) -> None:
    for stub in running_stub():
        stub.reply_json("/stock/parcel", {"available": 1})
        path = tmp_path / "config.yaml"
        path.write_text(
            "state_machines:\n"
            "  order:\n"
            "    feeds:\n"
            f"      - {{name: stock, url: '{stub.url('/stock/<label>')}'}}\n"
            "    states:\n"
            "      - action: ship\n"
            "        webhook: http://127.0.0.1:9/ship\n"
            "        next: restock\n"
            "      - gate: restock\n"
            "        triggers: [{event: entry}]\n"
            "        exit_condition: feeds.stock.available > 0\n"
            "        next: done\n"
            "      - gate: done\n"
            "        exit_condition: false\n"
        )
        app = App(config=load_config([path]), db=db_engine)
        machine = app.config.get_machine("order")
        label = service.create_label(app, machine, "parcel", {})
        assert label.state == "ship"

        waiting = complete_deliveries(app, _delivered(app, "parcel"))
        assert [claim.state for claim in waiting] == ["restock"]  # leased, to read its feed
        service.advance_with_feeds(app, ("order", "parcel"), waiting[0].entry_id, timeout=5)

        after = service.get_label(app, machine, "parcel")
        assert (after.state, after.due_at) == ("done", None)
        moves = [(e.old_state, e.new_state) for e in service.history(app, machine, "parcel")]
        assert moves == [(None, "ship"), ("ship", "restock"), ("restock", "done")]
