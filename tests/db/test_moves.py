"""A label moved alone (the plainer one-move statement) ends up exactly as one moved in a batch."""

from __future__ import annotations

import dataclasses
import datetime

import sqlalchemy as sa

from routemaster.db import labels as store
from routemaster.db import transitions
from routemaster.db.labels import Label, Moves

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=5)


def _created(conn: sa.Connection, name: str) -> Label:
    label = transitions.insert(conn, "m", name, {"k": 1}, state="a", now=NOW, due=False)
    assert label is not None
    return label


def _history(conn: sa.Connection, name: str) -> list[tuple[object, ...]]:
    return [
        (entry.old_state, entry.new_state, entry.created, entry.forced, entry.reason)
        for entry in store.history(conn, "m", name)
    ]


def _comparable(label: Label) -> dict[str, object]:
    fields = dataclasses.asdict(label)
    for varying in ("name", "entry_id", "created_at", "updated_at"):
        del fields[varying]
    return fields


def test_one_label_moving_one_state_is_written_as_a_batch_would(db_engine: sa.Engine) -> None:
    for forced, reason, due_at in ((False, None, None), (True, "by hand", LATER)):
        with db_engine.begin() as conn:
            alone, batched, other = (_created(conn, n) for n in ("alone", "batched", "other"))
            [moved_alone] = transitions.write_moves(
                conn, [Moves(alone, ("b",), due_at, forced, reason)], now=LATER
            )
            moved_batched, _ = transitions.write_moves(
                conn,
                [
                    Moves(batched, ("b",), due_at, forced, reason),
                    Moves(other, ("b", "c"), None),
                ],
                now=LATER,
            )
            assert _comparable(moved_alone) == _comparable(moved_batched)
            assert moved_alone.state == "b" and moved_alone.previous_state == "a"
            assert moved_alone.due_at == due_at and moved_alone.state_entered_at == LATER
            assert moved_alone == store.get(conn, "m", "alone")
            assert _history(conn, "alone") == _history(conn, "batched")
            assert moved_alone.entry_id == store.history(conn, "m", "alone")[-1].id
            conn.execute(sa.text("TRUNCATE labels, history"))
