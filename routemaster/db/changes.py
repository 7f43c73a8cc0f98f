"""The changes stream's one query: history in commit-safe order, from a position on.

History ids come from a sequence, so a transaction can take id 10, commit
after another transaction that took id 11, and a reader that had already
returned 11 would skip 10 for good. So each history row also carries the id
of the transaction that wrote it (``xact_id``, migration 0005), and a reader
returns only rows whose transaction id is below the oldest transaction still
running when the read starts (``pg_snapshot_xmin``): every transaction below
that has finished, and any later writer gets a higher transaction id. Rows
are ordered by (transaction id, history id); that pair is a change's
:class:`Position`, and resuming after a position misses nothing and repeats
nothing.

The horizon is refined in one way: ``pg_snapshot_xmin`` is server-wide, so a
long transaction in *another* database of the same server would hold every
stream back. A transaction that the read's snapshot saw running and that is
still running in another database (``pg_stat_activity``) cannot have written
our history, so it is left out. A transaction that has ended meanwhile, or
whose database is not known, still counts: the horizon only ever errs on the
side of waiting.

The price: a change is seen once every transaction of this database that was
writing when it was made has finished, so a long write transaction holds the
stream back (never loses anything).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

_POSITION = re.compile(r"(\d{1,19})-(\d{1,19})")


@dataclass(frozen=True, order=True)
class Position:
    """Where a change sits in the stream: (writing transaction, history id).

    Written ``XACT-ID`` (two decimal integers); positions compare as pairs.
    """

    xact: int
    id: int

    def __str__(self) -> str:
        return f"{self.xact}-{self.id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """``ValueError`` unless ``text`` is a position as this module writes them."""
        match = _POSITION.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not a stream position: {text[:40]!r}")
        return cls(int(match[1]), int(match[2]))


START = Position(0, 0)
"""Before every change (``XACT-ID`` with ids that are never used)."""


@dataclass(frozen=True)
class Change:
    """One history entry: a label created, moved, deleted, or an operator's command."""

    position: Position
    state_machine: str
    label: str
    old_state: str | None
    new_state: str | None
    at: datetime.datetime
    forced: bool
    reason: str | None
    version: int | None = None  # the machine version the writing process ran

    @property
    def kind(self) -> str:
        if self.forced:
            return "forced"
        if self.old_state is None:
            return "created"
        if self.new_state is None:
            return "deleted"
        return "moved"


@dataclass(frozen=True)
class Page:
    """Changes after a position, and where the next read starts."""

    changes: list[Change]
    reached: Position  # every change up to here has been returned (or filtered out)


def read_changes(conn: sa.Connection, after: Position, *, machine: str | None, limit: int) -> Page:
    """Up to ``limit`` finished changes after ``after``, in position order.

    When the page is not full, the cursor moves on to the horizon (every
    transaction below it has finished), so a reader that found nothing still
    advances, and readers that have caught up share one cursor.
    """
    params = {"xact": str(after.xact), "id": after.id, "limit": limit, "sm": machine}
    query = _ALL if machine is None else _ONE_MACHINE
    rows = conn.execute(query, params).all()
    horizon = int(rows[0].horizon)
    changes = [_change(row) for row in rows if row.id is not None]
    if len(changes) >= limit:
        return Page(changes, changes[-1].position)
    return Page(changes, max(after, Position(horizon, 0)))


def recent_changes(conn: sa.Connection, machine: str, *, limit: int) -> list[Change]:
    """The machine's latest ``limit`` changes that ``conn`` can see, newest first."""
    rows = conn.execute(_RECENT, {"sm": machine, "limit": limit}).all()
    return [_change(row) for row in rows]


def _change(row: sa.Row[Any]) -> Change:
    return Change(
        position=Position(int(row.xact), row.id),
        state_machine=row.state_machine,
        label=row.label,
        old_state=row.old_state,
        new_state=row.new_state,
        at=row.created,
        forced=row.forced,
        reason=row.reason,
        version=row.version,
    )


_RECENT = sa.text(
    """
    SELECT CAST(xact_id AS text) AS xact, id, state_machine, label, old_state, new_state,
           created, forced, reason, version
    FROM history WHERE state_machine = :sm
    ORDER BY xact_id DESC, id DESC LIMIT :limit
    """
)


# The oldest transaction of this database still running when the statement's
# snapshot was taken (or the snapshot's xmax when there is none): every
# transaction below it that wrote here has finished, and the statement's
# snapshot sees all of those that committed.
_HORIZON_CTE = """
    snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s),
    horizon AS MATERIALIZED (
        SELECT LEAST(
            pg_snapshot_xmax(snap.s),
            (SELECT min(running) FROM pg_snapshot_xip(snap.s) AS running
             WHERE NOT EXISTS (
                 SELECT 1 FROM pg_stat_activity AS other
                 WHERE other.backend_xid = xid(running)
                   AND other.datname IS DISTINCT FROM current_database())))
        AS xmin
        FROM snap
    )
"""


def _query(machine_filter: str) -> sa.TextClause:
    return sa.text(
        f"""
        WITH {_HORIZON_CTE}
        SELECT CAST(horizon.xmin AS text) AS horizon, CAST(c.xact_id AS text) AS xact, c.id,
               c.state_machine, c.label, c.old_state, c.new_state, c.created, c.forced,
               c.reason, c.version
        FROM horizon LEFT JOIN LATERAL (
            SELECT xact_id, id, state_machine, label, old_state, new_state, created, forced,
                   reason, version
            FROM history
            WHERE {machine_filter}(xact_id, id) > (CAST(:xact AS xid8), :id)
              AND xact_id < horizon.xmin
            ORDER BY xact_id, id
            LIMIT :limit
        ) AS c ON true
        ORDER BY c.xact_id, c.id
        """
    )


_ALL = _query("")
_ONE_MACHINE = _query("state_machine = :sm AND ")


def current_position(conn: sa.Connection) -> Position:
    """The horizon as a position: a stream started here shows changes from about now on."""
    return Position(int(conn.execute(_HORIZON).scalar_one()), 0)


_HORIZON = sa.text(f"WITH {_HORIZON_CTE} SELECT CAST(xmin AS text) FROM horizon")


@dataclass(frozen=True)
class Snapshot:
    """Which transactions a read saw: those below ``xmin``, and below ``xmax`` but not running.

    A page that shows counts read in this snapshot and then follows the
    stream from :attr:`position` skips the changes the snapshot already saw.
    """

    xmin: int
    xmax: int
    running: tuple[int, ...]

    @property
    def position(self) -> Position:
        return Position(self.xmin, 0)

    def saw(self, xact: int) -> bool:
        return xact < self.xmin or (xact < self.xmax and xact not in self.running)

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.running))}"


def snapshot(conn: sa.Connection) -> Snapshot:
    """The snapshot of ``conn``'s transaction (use REPEATABLE READ to read more in it)."""
    text = str(conn.execute(_SNAPSHOT).scalar_one())
    xmin, xmax, running = text.split(":")
    return Snapshot(int(xmin), int(xmax), tuple(int(x) for x in running.split(",") if x))


_SNAPSHOT = sa.text("SELECT CAST(pg_current_snapshot() AS text)")
