"""Labels per state, kept: counts folded from history, plus the history not folded yet.

Every change of a label's state already appends a history row naming the
state it left (``old_state``, NULL for a create) and the state it entered
(``new_state``, NULL for a delete), in the same statement as the change. So
the live labels of a (machine, state) are the rows that entered it minus the
rows that left it, and nothing extra is written when a label moves.

``label_counts`` keeps those sums up to a position (``label_counts_folded``,
one row): every history row before it is counted there, none after it.
:func:`fold` moves that position on to a final horizon (on one server the
oldest transaction still running; on Citus the horizon the workers confirm,
as the changes stream reads them: :mod:`routemaster.db.changes`), in one
short transaction that locks the position row, so folds that race add each
row once. A read (:func:`kept_per_state`, :func:`kept_in_machine`) is the
stored counts plus the rows after the position that its snapshot sees, read
from ``history_by_position``: its cost is what changed since the last fold,
never the labels stored.

:func:`recount` (``routemaster migrate`` the first time, ``--recount`` on
demand) counts the labels once, with writes to ``labels`` held for the count.
Rows that do not change a state (errors, operator notes, retries) add
nothing. Retention folds before it removes history (``service.retention``).
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from routemaster.db.statements import fetch_all, fetch_one, fetch_value, run

StateCounts = dict[tuple[str, str], int]
"""Labels per (machine, state)."""

FOLD_BATCH = 50_000
"""History rows one fold adds at most (a fold that lags catches up over several)."""

_KEPT = "SELECT to_regclass('label_counts_folded') IS NOT NULL"

_POSITION = """
    SELECT CAST(xact AS text), id FROM label_counts_folded
    """

_POSITION_FOR_FOLD = """
    SELECT CAST(xact AS text), id FROM label_counts_folded FOR UPDATE
    """

# The position and the counts folded to it, in one snapshot (a fold commits both together).
_STORED = """
    SELECT CAST(f.xact AS text), f.id, c.state_machine, c.state, c.count
    FROM label_counts_folded AS f LEFT JOIN label_counts AS c ON true
    """

_STORED_IN_MACHINE = """
    SELECT CAST(f.xact AS text), f.id, c.state, c.count
    FROM label_counts_folded AS f LEFT JOIN label_counts AS c ON c.state_machine = %(sm)s
    """

# History after the folded position that this statement's snapshot sees, as +1 for the
# state entered and -1 for the state left (by ``history_by_position``; one machine's by
# ``history_by_machine_position``).
_TAIL = """
    SELECT h.state_machine, s.state, sum(s.delta)
    FROM history AS h
    CROSS JOIN LATERAL (VALUES (h.old_state, -1), (h.new_state, 1)) AS s(state, delta)
    WHERE (h.xact_id, h.id) > (CAST(%(xact)s AS xid8), %(id)s)
      AND h.old_state IS DISTINCT FROM h.new_state AND s.state IS NOT NULL
    GROUP BY h.state_machine, s.state
    """

_TAIL_IN_MACHINE = """
    SELECT s.state, sum(s.delta)
    FROM history AS h
    CROSS JOIN LATERAL (VALUES (h.old_state, -1), (h.new_state, 1)) AS s(state, delta)
    WHERE h.state_machine = %(sm)s AND (h.xact_id, h.id) > (CAST(%(xact)s AS xid8), %(id)s)
      AND h.old_state IS DISTINCT FROM h.new_state AND s.state IS NOT NULL
    GROUP BY s.state
    """

# One fold: the first ``limit`` history rows after the position and below the horizon, in
# position order (each shard by its (xact_id, id) index on Citus, merged on the coordinator),
# summed per state, with how many were read and the last one's position.
_BATCH = """
    WITH batch AS MATERIALIZED (
        SELECT xact_id, id, state_machine, old_state, new_state FROM history
        WHERE (xact_id, id) > (CAST(%(xact)s AS xid8), %(id)s)
          AND xact_id < CAST(%(below)s AS xid8)
        ORDER BY xact_id, id
        LIMIT %(limit)s
    ), last AS (
        SELECT (SELECT count(*) FROM batch) AS n,
               (SELECT CAST(xact_id AS text) FROM batch
                ORDER BY xact_id DESC, id DESC LIMIT 1) AS xact,
               (SELECT id FROM batch ORDER BY xact_id DESC, id DESC LIMIT 1) AS id
    ), deltas AS (
        SELECT b.state_machine, s.state, sum(s.delta) AS delta
        FROM batch AS b
        CROSS JOIN LATERAL (VALUES (b.old_state, -1), (b.new_state, 1)) AS s(state, delta)
        WHERE b.old_state IS DISTINCT FROM b.new_state AND s.state IS NOT NULL
        GROUP BY b.state_machine, s.state
    )
    SELECT last.n, last.xact, last.id, deltas.state_machine, deltas.state, deltas.delta
    FROM last LEFT JOIN deltas ON true
    """

_ADD = """
    INSERT INTO label_counts AS c (state_machine, state, count)
    SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(states)s AS text[]),
                         CAST(%(deltas)s AS bigint[]))
    ON CONFLICT (state_machine, state) DO UPDATE SET count = c.count + excluded.count
    """

_DROP_EMPTY = "DELETE FROM label_counts WHERE count = 0"

_ADVANCE = """
    UPDATE label_counts_folded SET xact = CAST(%(xact)s AS xid8), id = %(id)s,
                                   folded_at = now()
    """

# Recounting: the folds wait (the position row's table), then every write to labels.
_HOLD_FOLDS = "LOCK TABLE label_counts_folded IN EXCLUSIVE MODE"
_HOLD_LABELS = "LOCK TABLE labels IN SHARE MODE"

_LIVE = """
    SELECT state_machine, state, count(*) FROM labels WHERE NOT deleted
    GROUP BY state_machine, state
    """

# History at or after a position: counted by the live labels already, added again by folds.
_SINCE = """
    SELECT h.state_machine, s.state, sum(s.delta)
    FROM history AS h
    CROSS JOIN LATERAL (VALUES (h.old_state, -1), (h.new_state, 1)) AS s(state, delta)
    WHERE h.xact_id >= CAST(%(xact)s AS xid8)
      AND h.old_state IS DISTINCT FROM h.new_state AND s.state IS NOT NULL
    GROUP BY h.state_machine, s.state
    """

_CLEAR = "DELETE FROM label_counts"

_SET_POSITION = """
    INSERT INTO label_counts_folded (one, xact, id, folded_at)
    VALUES (true, CAST(%(xact)s AS xid8), 0, now())
    ON CONFLICT (one) DO UPDATE SET xact = excluded.xact, id = 0, folded_at = now()
    """


def has_table(conn: sa.Connection) -> bool:
    """Whether the database is migrated to kept counts (``plan`` may run before)."""
    return bool(fetch_value(conn, _KEPT))


def kept(conn: sa.Connection) -> bool:
    """Whether counts are kept here: the table exists and :func:`recount` has run."""
    return has_table(conn) and fetch_one(conn, _POSITION) is not None


def kept_per_state(conn: sa.Connection) -> StateCounts | None:
    """Live labels per machine and state (none: absent); ``None`` if counts are not kept yet.

    Exact as of the snapshot of its second statement: the first reads the
    position and the counts folded to it together, the second the history
    after that position; a fold that commits between them leaves the rows it
    folded in history, where the second finds them.
    """
    rows = fetch_all(conn, _STORED)
    if not rows:
        return None
    counts: StateCounts = {
        (machine, state): int(n) for _, _, machine, state, n in rows if machine is not None
    }
    params = {"xact": rows[0][0], "id": rows[0][1]}
    for machine, state, delta in fetch_all(conn, _TAIL, params):
        counts[(machine, state)] = counts.get((machine, state), 0) + int(delta)
    return {key: n for key, n in counts.items() if n}


def kept_in_machine(conn: sa.Connection, machine: str) -> dict[str, int] | None:
    """One machine's live labels per state (as :func:`kept_per_state`)."""
    rows = fetch_all(conn, _STORED_IN_MACHINE, {"sm": machine})
    if not rows:
        return None
    counts = {state: int(n) for _, _, state, n in rows if state is not None}
    params = {"sm": machine, "xact": rows[0][0], "id": rows[0][1]}
    for state, delta in fetch_all(conn, _TAIL_IN_MACHINE, params):
        counts[state] = counts.get(state, 0) + int(delta)
    return {state: n for state, n in counts.items() if n}


def fold(conn: sa.Connection, below: int, *, limit: int = FOLD_BATCH) -> int:
    """Fold history rows before transaction ``below`` (a final horizon) into the counts.

    Run in the caller's transaction (short: it holds the position row).
    Returns the rows folded (0 when another fold got there first, or counts
    are not kept yet).
    """
    position = fetch_one(conn, _POSITION_FOR_FOLD)
    if position is None or int(position[0]) >= below:
        return 0
    rows = fetch_all(
        conn, _BATCH, {"xact": position[0], "id": position[1], "below": str(below), "limit": limit}
    )
    n, last_xact, last_id = rows[0][0], rows[0][1], rows[0][2]
    deltas = [(machine, state, int(d)) for _, _, _, machine, state, d in rows if machine]
    if deltas:
        _add(conn, deltas)
    if n >= limit:
        run(conn, _ADVANCE, {"xact": last_xact, "id": last_id})
    else:
        run(conn, _ADVANCE, {"xact": str(below), "id": 0})
    return int(n)


def recount(
    conn: sa.Connection, horizon: Callable[[sa.Connection], int], *, settle: Callable[[], None]
) -> None:
    """Count the live labels once and keep counting from here (the caller's transaction).

    Writes to ``labels`` wait until the transaction ends. ``settle`` returns
    once every transaction that wrote labels before the lock is visible
    everywhere (on Citus: no longer prepared on a worker); ``horizon`` then
    gives the position: history before it is in the count, history at or
    after it that the count saw is taken off again, as the folds will add it.
    """
    run(conn, _HOLD_FOLDS)
    run(conn, _HOLD_LABELS)
    settle()
    xact = horizon(conn)
    counts: dict[tuple[str, str], int] = {}
    for machine, state, n in fetch_all(conn, _LIVE):
        counts[(machine, state)] = int(n)
    for machine, state, delta in fetch_all(conn, _SINCE, {"xact": str(xact)}):
        counts[(machine, state)] = counts.get((machine, state), 0) - int(delta)
    run(conn, _CLEAR)
    _add(conn, [(machine, state, n) for (machine, state), n in counts.items()])
    run(conn, _SET_POSITION, {"xact": str(xact)})


def _add(conn: sa.Connection, deltas: list[tuple[str, str, int]]) -> None:
    if not deltas:
        return
    run(
        conn,
        _ADD,
        {
            "machines": [machine for machine, _, _ in deltas],
            "states": [state for _, state, _ in deltas],
            "deltas": [delta for _, _, delta in deltas],
        },
    )
    run(conn, _DROP_EMPTY)
