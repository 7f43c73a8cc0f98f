"""Label transitions have one home (routemaster/db/transitions.py); a mass retry is one statement.

Issue 34: each transition is one statement or one function, which every path calls,
and history is appended there alone.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from routemaster.db import labels as store
from routemaster.db import transitions
from routemaster.db.labels import Label
from tests.db.test_statement_text import STATEMENTS

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(hours=1)

# The SET list of an UPDATE of labels, up to where its FROM, WHERE or RETURNING begins.
_SET_LIST = re.compile(r"UPDATE labels SET(.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b)", re.S)
# What a label is (as opposed to when it is due or who leases it).
_WHAT_IT_IS = re.compile(
    r"(?:^|,)\s*(state|deleted|errored|paused|paused_until|metadata|version|entry_id)\s*="
)


def test_every_transition_and_every_history_row_is_written_in_one_module() -> None:
    outside = []
    for name, sql in STATEMENTS:
        transition = (
            "INSERT INTO labels" in sql
            or "DELETE FROM labels" in sql
            or "INSERT INTO history" in sql
            or any(_WHAT_IT_IS.search(found) for found in _SET_LIST.findall(sql))
        )
        if transition and not name.startswith("transitions."):
            outside.append(name)
    assert outside == []


def _errored(conn: sa.Connection, name: str) -> Label:
    label = transitions.insert(conn, "m", name, {}, state="a", now=NOW, due=True)
    assert label is not None
    [errored] = transitions.become_errored(
        conn, [transitions.Erring("m", name, label.entry_id, "boom")], now=NOW
    )
    return errored


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[str]]:
    """The statements run on ``engine`` meanwhile."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def test_a_mass_retry_is_one_statement_and_leaves_labels_no_longer_errored_alone(
    db_engine: sa.Engine,
) -> None:
    with db_engine.begin() as conn:
        for n in range(20):
            _errored(conn, f"e{n}")
        assert transitions.insert(conn, "m", "fine", {}, state="a", now=NOW) is not None
        _errored(conn, "gone")
        assert transitions.soft_delete(conn, "m", "gone", now=NOW) == "a"
    keys = [("m", f"e{n}") for n in range(20)] + [("m", "fine"), ("m", "gone")]
    with db_engine.begin() as conn, _statements(db_engine) as seen:
        retried = transitions.retry(conn, keys, now=LATER, reason="mass retry")
    assert sorted(label.name for label in retried) == sorted(f"e{n}" for n in range(20))
    assert sum("UPDATE labels" in statement for statement in seen) == 1
    assert sum("INSERT INTO history" in statement for statement in seen) == 1
    with db_engine.connect() as conn:
        for n in range(20):
            label = store.get(conn, "m", f"e{n}")
            assert label is not None
            assert not label.errored and label.attempts == 0 and label.due_at == LATER
            last = store.history(conn, "m", f"e{n}")[-1]
            assert (last.old_state, last.new_state, last.forced, last.reason) == (
                "a",
                "a",
                True,
                "mass retry",
            )
        fine = store.get(conn, "m", "fine")
        assert fine is not None and fine.updated_at == NOW
        assert [entry.kind for entry in store.history(conn, "m", "fine")] == ["created"]
        assert [entry.kind for entry in store.history(conn, "m", "gone")][-1] == "deleted"
    with db_engine.begin() as conn:  # retried already: nothing more
        assert transitions.retry(conn, keys[:3], now=LATER, reason="again") == []


def test_a_pause_and_its_end_are_one_transition(db_engine: sa.Engine) -> None:
    with db_engine.begin() as conn:
        label = transitions.insert(conn, "m", "p", {}, state="a", now=NOW, due=True)
        assert label is not None
        paused = transitions.pause(conn, label, True, now=NOW, reason="hold", until=LATER)
        assert paused.paused
        again = transitions.pause(conn, paused, True, now=NOW, reason="hold", until=None)
        assert again == paused  # only the end changed, with no history row
    with db_engine.connect() as conn:
        until = conn.execute(sa.text("SELECT paused_until FROM labels WHERE name = 'p'"))
        assert until.scalar_one() is None
        assert [entry.reason for entry in store.history(conn, "m", "p")] == [None, "hold"]
    with db_engine.begin() as conn:
        resumed = transitions.pause(conn, again, False, now=LATER, reason="go", until=LATER)
        assert not resumed.paused
    with db_engine.connect() as conn:
        until = conn.execute(sa.text("SELECT paused_until FROM labels WHERE name = 'p'"))
        assert until.scalar_one() is None  # resuming clears the end, whatever is passed
        assert [entry.reason for entry in store.history(conn, "m", "p")][-1] == "go"
