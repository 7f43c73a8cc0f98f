"""Pauses with an end (``{"until": ...}``): when a paused label resumes by itself."""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster.db.keys import label_key
from routemaster.db.labels import _COLUMNS, Label, _label


def set_until(
    conn: sa.Connection, state_machine: str, name: str, until: datetime.datetime | None
) -> None:
    """When the (locked) label's pause ends by itself; ``None``: only when resumed."""
    conn.execute(
        _SET_UNTIL, {"sm": state_machine, "name": name, "key": label_key(name), "until": until}
    )


def paused_until(conn: sa.Connection, state_machine: str, name: str) -> datetime.datetime | None:
    until: datetime.datetime | None = conn.execute(
        _PAUSED_UNTIL, {"sm": state_machine, "name": name, "key": label_key(name)}
    ).scalar()
    return until


def lock_ended(conn: sa.Connection, *, now: datetime.datetime, limit: int) -> list[Label]:
    """Lock up to ``limit`` paused labels whose pause has ended."""
    rows = conn.execute(_LOCK_ENDED, {"now": now, "limit": limit}).all()
    return [_label(row) for row in rows]


_ONE = "state_machine = :sm AND name_key = :key AND name = :name"

_SET_UNTIL = sa.text(f"UPDATE labels SET paused_until = :until WHERE {_ONE}")

_PAUSED_UNTIL = sa.text(f"SELECT paused_until FROM labels WHERE {_ONE} AND paused")

_LOCK_ENDED = sa.text(
    f"""
    SELECT {_COLUMNS} FROM labels
    WHERE paused_until <= :now AND paused AND NOT deleted
    ORDER BY paused_until
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)
