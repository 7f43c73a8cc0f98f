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

On Citus (history distributed over workers) the horizon is the coordinator's,
confirmed by the workers (:mod:`routemaster.db.horizon`: a transaction that
writes to two workers makes one worker's rows visible before the other's),
and the read is two statements: the gap, then history below that horizon,
a multi-shard read whose ``ORDER BY ... LIMIT`` each shard runs on its own
``(xact_id, id)`` index before the coordinator merges them. Positions are the
same pairs on both: a position survives a move to Citus, a shard move and a
rebalance (shards are copied with their values).

Retention (:mod:`routemaster.db.retention`) removes old history and records,
per machine, the newest position it removed. A read from before that
position cannot be complete, so it says so: the page carries a ``gap`` (that
position) and continues after it. Nothing is skipped without a gap.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.horizon import Horizon
from routemaster.db.labels import history_kind
from routemaster.db.statements import Row, fetch_all, fetch_one, fetch_value

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
    recorded_kind: str | None = None  # "errored"; None: what the states and forced say
    version: int | None = None  # the machine version the writing process ran

    @property
    def kind(self) -> str:
        return history_kind(self.recorded_kind, self.forced, self.old_state, self.new_state)


@dataclass(frozen=True)
class Page:
    """Changes after a position, and where the next read starts."""

    changes: list[Change]
    reached: Position  # every change up to here has been returned (or filtered out)
    # the read started before history that retention removed: it continued after this
    gap: Position | None = None


def read_changes(
    conn: sa.Connection, after: Position, *, machine: str | None, limit: int, horizon: Horizon
) -> Page:
    """Up to ``limit`` finished changes after ``after``, in position order.

    When the page is not full, the cursor moves on to the horizon (every
    transaction below it has finished), so a reader that found nothing still
    advances, and readers that have caught up share one cursor. ``horizon``
    is the process's (:attr:`routemaster.app.App.horizon`).
    """
    if horizon.distributed(conn):
        return _read_distributed(conn, after, machine=machine, limit=limit, horizon=horizon)
    params = {"xact": str(after.xact), "id": after.id, "limit": limit, "sm": machine}
    rows = fetch_all(conn, _CHANGES, params)
    horizon_xact = int(rows[0][0])
    gap = Position.parse(rows[0][1]) if rows[0][1] is not None else None
    changes = [_change(row[2:]) for row in rows if row[3] is not None]
    if len(changes) >= limit:
        return Page(changes, changes[-1].position, gap)
    return Page(changes, max(after, gap or after, Position(horizon_xact, 0)), gap)


def _read_distributed(
    conn: sa.Connection, after: Position, *, machine: str | None, limit: int, horizon: Horizon
) -> Page:
    """:func:`read_changes` on Citus: below the confirmed horizon, gap first.

    A reader that has caught up with the horizon asks no worker anything:
    an idle stream costs the workers nothing between confirmations.
    """
    below = horizon.confirmed(conn)
    found = fetch_one(conn, _GAP, {"xact": str(after.xact), "id": after.id, "sm": machine})
    gap = Position.parse(found[0]) if found is not None else None
    start = gap or after
    if start >= Position(below, 0):  # caught up: no change after it is below the horizon yet
        return Page([], start, gap)
    params = {
        "xact": str(start.xact),
        "id": start.id,
        "horizon": str(below),
        "limit": limit,
        "sm": machine,
    }
    changes = [_change(row) for row in fetch_all(conn, _CHANGES_BELOW, params)]
    if len(changes) >= limit:
        return Page(changes, changes[-1].position, gap)
    return Page(changes, max(start, Position(below, 0)), gap)


def recent_changes(conn: sa.Connection, machine: str, *, limit: int) -> list[Change]:
    """The machine's latest ``limit`` changes that ``conn`` can see, newest first.

    In position order, read from an index: the cost is ``limit`` rows, whatever the
    history holds.
    """
    rows = fetch_all(conn, _RECENT, {"sm": machine, "limit": limit})
    return [_change(row) for row in rows]


def _change(row: Row) -> Change:
    """A change from a row of (xact, id, state_machine, label, old and new state, created,
    forced, reason, kind, version)."""
    (
        xact,
        id_,
        state_machine,
        label,
        old_state,
        new_state,
        created,
        forced,
        reason,
        kind,
        version,
    ) = row
    return Change(
        position=Position(int(xact), id_),
        state_machine=state_machine,
        label=label,
        old_state=old_state,
        new_state=new_state,
        at=created,
        forced=forced,
        reason=reason,
        recorded_kind=kind,
        version=version,
    )


# Backwards along ``history_by_machine_position`` (state_machine, xact_id, id), stopping after
# ``limit`` rows; on Citus each shard does the same and the coordinator merges their first
# rows. The sort names the table's columns: a bare ``xact_id`` would name the output column
# ``CAST(xact_id AS text)`` and sort the whole machine's history as text (10000 before 9999).
_RECENT = """
    SELECT CAST(history.xact_id AS text) AS position_xact, history.id, state_machine, label,
           old_state, new_state, created, forced, reason, kind, version
    FROM history WHERE state_machine = %(sm)s
    ORDER BY history.xact_id DESC, history.id DESC LIMIT %(limit)s
    """

# The horizon first: the oldest transaction of this database still running when the
# statement's snapshot was taken (or the snapshot's xmax when there is none). Every
# transaction below it that wrote here has finished, and the statement's snapshot sees all
# of those that committed. Then up to ``limit`` changes after the position, below the
# horizon (of one machine when ``sm`` is given; PostgreSQL drops the test of a NULL ``sm``
# while planning, so each case has the plan of its own index). A position that retention
# removed history after (``retention_horizons``: of the machine, or of any machine for the
# whole stream) is the gap: the read starts after it instead. With no change to return,
# the one row holds the horizon, the gap and NULLs.
_CHANGES = """
    WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s),
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
    ),
    gap AS MATERIALIZED (
        SELECT pruned_xact AS xact, pruned_id AS id FROM retention_horizons
        WHERE (CAST(%(sm)s AS text) IS NULL OR state_machine = %(sm)s)
          AND (pruned_xact, pruned_id) > (CAST(%(xact)s AS xid8), %(id)s)
        ORDER BY pruned_xact DESC, pruned_id DESC
        LIMIT 1
    ),
    start AS MATERIALIZED (
        SELECT coalesce(gap.xact, CAST(%(xact)s AS xid8)) AS xact,
               coalesce(gap.id, %(id)s) AS id,
               CAST(gap.xact AS text) || '-' || gap.id AS gap
        FROM (SELECT 1) AS one LEFT JOIN gap ON true
    )
    SELECT CAST(horizon.xmin AS text), start.gap, CAST(c.xact_id AS text), c.id,
           c.state_machine, c.label, c.old_state, c.new_state, c.created, c.forced, c.reason,
           c.kind, c.version
    FROM horizon CROSS JOIN start LEFT JOIN LATERAL (
        SELECT xact_id, id, state_machine, label, old_state, new_state, created, forced, reason,
               kind, version
        FROM history
        WHERE (CAST(%(sm)s AS text) IS NULL OR state_machine = %(sm)s)
          AND (xact_id, id) > (start.xact, start.id)
          AND xact_id < horizon.xmin
        ORDER BY xact_id, id
        LIMIT %(limit)s
    ) AS c ON true
    ORDER BY c.xact_id, c.id
    """

# On Citus, the gap alone (retention_horizons is a table of the coordinator) ...
_GAP = """
    SELECT CAST(pruned_xact AS text) || '-' || pruned_id FROM retention_horizons
    WHERE (CAST(%(sm)s AS text) IS NULL OR state_machine = %(sm)s)
      AND (pruned_xact, pruned_id) > (CAST(%(xact)s AS xid8), %(id)s)
    ORDER BY pruned_xact DESC, pruned_id DESC
    LIMIT 1
    """

# ... then history after the start, below the confirmed horizon: every shard returns its
# first ``limit`` rows by its (xact_id, id) index, or (state_machine, xact_id, id) for one
# machine, and the coordinator merges them.
_CHANGES_BELOW = """
    SELECT CAST(xact_id AS text) AS xact, id, state_machine, label, old_state, new_state, created,
           forced, reason, kind, version
    FROM history
    WHERE (CAST(%(sm)s AS text) IS NULL OR state_machine = %(sm)s)
      AND (xact_id, id) > (CAST(%(xact)s AS xid8), %(id)s)
      AND xact_id < CAST(%(horizon)s AS xid8)
    ORDER BY xact_id, id
    LIMIT %(limit)s
    """


def present(conn: sa.Connection) -> Position:
    """The present as a position: what a stream or a subscription "started now" starts after.

    Every change committed before this call is at or before it, and every
    change of a transaction that begins writing after it comes after it. A
    transaction still running meanwhile started before, and is left out with
    the past. (The horizon would not do: while any older transaction is open,
    changes committed after it but before now lie above the horizon, and a
    start there would show them.) The same on Citus: history carries the
    coordinator's transaction ids, and this is the coordinator's snapshot.
    """
    return Position(int(fetch_value(conn, _PRESENT)), 0)


_PRESENT = "SELECT CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text)"


def horizon_position(conn: sa.Connection, horizon: Horizon) -> Position:
    """The horizon as a position: every change before it can be read now (lag counts to it)."""
    if horizon.distributed(conn):
        return Position(horizon.confirmed(conn), 0)
    return Position(horizon.coordinator(conn), 0)


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
    text = str(fetch_value(conn, _SNAPSHOT))
    xmin, xmax, running = text.split(":")
    return Snapshot(int(xmin), int(xmax), tuple(int(x) for x in running.split(",") if x))


_SNAPSHOT = "SELECT CAST(pg_current_snapshot() AS text)"
