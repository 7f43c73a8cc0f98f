"""Retention's statements: pruning history, and the horizon of what it removed.

Removing deleted labels and deleting finished ones are label transitions
(:func:`routemaster.db.transitions.purge_deleted`, ``delete_finished``); retention
runs them in its leader's transaction and records what they removed here.

Every statement takes one bounded batch, and each batch is its own short
transaction that first takes :data:`LEADER_KEY` with
``pg_try_advisory_xact_lock``: the lock ends with the transaction, so it
needs no session of its own (it holds behind a transaction-mode pooler),
and a worker that does not get it leaves the batch to the one that did.
Labels are taken with ``FOR UPDATE SKIP LOCKED``: pruning never waits on a
label the API is changing, and the API waits at most one batch on it.

History is scanned from where the last batch stopped (``scanned``, per
machine), oldest position first, and a batch stops at the first row newer
than the cutoff, so kept rows (each label's current entry) are read once,
not at every run: the cost follows the rows pruned, never the labels that
wait. Every history row removed raises the machine's ``pruned`` position:
the changes stream answers a cursor below it with a gap
(:mod:`routemaster.db.changes`), and :func:`count_lost` charges each
subscription still behind a removed row.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.changes import START, Position
from routemaster.db.plumbing.database import distributed
from routemaster.db.shards import one_connection_per_node
from routemaster.db.statements import fetch_all, fetch_one, fetch_value, run
from routemaster.db.transitions import purge_deleted

LEADER_KEY = 0x726D7265746E  # "rmretn": one pruning leader at a time, per batch


@dataclass(frozen=True)
class Pruned:
    """What one batch did: rows it looked at, and the history positions it removed."""

    scanned: int
    removed: list[Position]
    labels: int = 0  # label rows removed or deleted


def lead(conn: sa.Connection) -> bool:
    """Whether this transaction is the pruning leader (until it ends)."""
    return bool(fetch_value(conn, _LEAD, {"key": LEADER_KEY}))


def prune_history(
    conn: sa.Connection, state_machine: str, *, cutoff: datetime.datetime, batch: int
) -> Pruned:
    """Remove up to ``batch`` history rows older than ``cutoff``, never a label's current entry."""
    params = {"sm": state_machine, "cutoff": cutoff, "batch": batch}
    if distributed(conn):
        scanned, last, removed = _prune_history_on_citus(conn, params)
    else:
        row = fetch_one(conn, _PRUNE_HISTORY, params)
        assert row is not None  # one row of aggregates
        scanned, last, removed = row
    positions = _positions(removed)
    if last is not None or positions:
        _advance(conn, state_machine, positions, scanned=Position.parse(last) if last else START)
    return Pruned(int(scanned), positions)


def remove_deleted(
    conn: sa.Connection, state_machine: str, *, cutoff: datetime.datetime, batch: int
) -> Pruned:
    """Remove up to ``batch`` labels deleted before ``cutoff``, with their whole history
    (:func:`routemaster.db.transitions.purge_deleted`), and record the positions removed."""
    if distributed(conn):
        one_connection_per_node(conn)  # retention_horizons, a reference table, is written after
    labels, removed = purge_deleted(conn, state_machine, cutoff=cutoff, batch=batch)
    positions = _positions(removed)
    if positions:
        _advance(conn, state_machine, positions, scanned=START)
    return Pruned(labels, positions, labels=labels)


def count_lost(conn: sa.Connection, state_machine: str, removed: Sequence[Position]) -> int:
    """Charge each subscription of ``state_machine`` with the removed changes it had not been
    sent (after its cursor and its batch in flight); how many subscriptions lost any."""
    if not removed:
        return 0
    params = {
        "sm": state_machine,
        "xacts": [str(position.xact) for position in removed],
        "ids": [position.id for position in removed],
    }
    return run(conn, _COUNT_LOST, params)


def pruned_position(conn: sa.Connection, state_machine: str | None) -> Position:
    """The newest position pruning removed (of one machine, or of any): the stream's horizon."""
    row = fetch_one(conn, _PRUNED_POSITION, {"sm": state_machine})
    return Position.parse(row[0]) if row is not None else START


def _prune_history_on_citus(
    conn: sa.Connection, params: dict[str, Any]
) -> tuple[int, str | None, list[str]]:
    """:data:`_PRUNE_HISTORY`'s answer on Citus (which refuses its ``LATERAL ... LIMIT``): the
    batch read across the shards (no lock), its old rows found here, deleted in one statement."""
    one_connection_per_node(conn)  # retention_horizons, a reference table, is written after
    frontier = fetch_one(conn, _FRONTIER, params)
    assert frontier is not None  # one row of aggregates
    xact, ident = frontier
    rows = fetch_all(conn, _HISTORY_AFTER, {**params, "xact": xact, "id": ident})
    old = list(itertools.takewhile(lambda row: row[3] < params["cutoff"], rows))
    if not old:
        return 0, None, []
    removing = {**params, "shard_keys": sorted({row[2] for row in old}), "ids": [r[1] for r in old]}
    removed = [f"{x}-{i}" for x, i in fetch_all(conn, _REMOVE_OLD_HISTORY, removing)]
    return len(old), f"{old[-1][0]}-{old[-1][1]}", removed


def _positions(texts: list[str] | None) -> list[Position]:
    return [Position.parse(text) for text in texts or ()]


def _advance(
    conn: sa.Connection, state_machine: str, removed: list[Position], *, scanned: Position
) -> None:
    newest = max(removed, default=START)
    params = {
        "sm": state_machine,
        "pruned_xact": str(newest.xact),
        "pruned_id": newest.id,
        "scanned_xact": str(scanned.xact),
        "scanned_id": scanned.id,
    }
    run(conn, _ADVANCE, params)


_LEAD = "SELECT pg_try_advisory_xact_lock(%(key)s)"

# From the machine's scan frontier, the next ``batch`` rows in position order; those before
# the first row newer than the cutoff are old. Of those, every row but a label's current
# entry (``labels.entry_id``, found by the label's primary key) is removed. Returns how
# many were old, the last old row's position (the new frontier) and the removed positions.
_PRUNE_HISTORY = """
    WITH frontier AS MATERIALIZED (
        SELECT coalesce(max(scanned_xact), '0') AS xact, coalesce(max(scanned_id), 0) AS id
        FROM retention_horizons WHERE state_machine = %(sm)s
    ),
    scanned AS MATERIALIZED (
        SELECT h.xact_id, h.id, h.label,
               bool_or(h.created >= %(cutoff)s) OVER (ORDER BY h.xact_id, h.id) AS stopped
        FROM frontier CROSS JOIN LATERAL (
            SELECT xact_id, id, label, created FROM history
            WHERE state_machine = %(sm)s AND (xact_id, id) > (frontier.xact, frontier.id)
            ORDER BY xact_id, id
            LIMIT %(batch)s
        ) AS h
    ),
    old AS MATERIALIZED (SELECT xact_id, id, label FROM scanned WHERE NOT stopped),
    removed AS (
        DELETE FROM history WHERE id IN (
            SELECT old.id FROM old
            WHERE NOT EXISTS (
                SELECT 1 FROM labels
                WHERE labels.state_machine = %(sm)s
                  AND labels.name_key = routemaster_label_key(old.label)
                  AND labels.entry_id = old.id))
        RETURNING xact_id, id
    )
    SELECT (SELECT count(*) FROM old),
           (SELECT CAST(xact_id AS text) || '-' || id FROM old
            ORDER BY xact_id DESC, id DESC LIMIT 1),
           (SELECT array_agg(CAST(xact_id AS text) || '-' || id) FROM removed)
    """


# On Citus (routemaster.db.shards), which refuses the statements above: LATERAL with a LIMIT,
# row locks across shards. History: the frontier, the batch after it, the old rows deleted.
_FRONTIER = """
    SELECT coalesce(max(scanned_xact), '0'), coalesce(max(scanned_id), 0)
    FROM retention_horizons WHERE state_machine = %(sm)s
    """

_HISTORY_AFTER = """
    SELECT CAST(xact_id AS text) AS xact, id, shard_key, created FROM history
    WHERE state_machine = %(sm)s AND (xact_id, id) > (CAST(%(xact)s AS xid8), %(id)s)
    ORDER BY xact_id, id
    LIMIT %(batch)s
    """

_REMOVE_OLD_HISTORY = """
    DELETE FROM history
    WHERE shard_key = ANY(CAST(%(shard_keys)s AS integer[]))
      AND id = ANY(CAST(%(ids)s AS bigint[])) AND state_machine = %(sm)s
      AND NOT EXISTS (
          SELECT 1 FROM labels
          WHERE labels.shard_key = history.shard_key AND labels.state_machine = %(sm)s
            AND labels.name_key = routemaster_label_key(history.label)
            AND labels.entry_id = history.id)
    RETURNING xact_id, id
    """


_ADVANCE = """
    INSERT INTO retention_horizons AS r (state_machine, pruned_xact, pruned_id,
                                         scanned_xact, scanned_id)
    VALUES (%(sm)s, CAST(%(pruned_xact)s AS xid8), %(pruned_id)s,
            CAST(%(scanned_xact)s AS xid8), %(scanned_id)s)
    ON CONFLICT (state_machine) DO UPDATE SET
        pruned_xact = CASE WHEN (excluded.pruned_xact, excluded.pruned_id)
                                > (r.pruned_xact, r.pruned_id)
                           THEN excluded.pruned_xact ELSE r.pruned_xact END,
        pruned_id = CASE WHEN (excluded.pruned_xact, excluded.pruned_id)
                              > (r.pruned_xact, r.pruned_id)
                         THEN excluded.pruned_id ELSE r.pruned_id END,
        scanned_xact = CASE WHEN (excluded.scanned_xact, excluded.scanned_id)
                                 > (r.scanned_xact, r.scanned_id)
                            THEN excluded.scanned_xact ELSE r.scanned_xact END,
        scanned_id = CASE WHEN (excluded.scanned_xact, excluded.scanned_id)
                               > (r.scanned_xact, r.scanned_id)
                          THEN excluded.scanned_id ELSE r.scanned_id END
    """

# Removed changes past a subscription's cursor and past its batch in flight (whose body is
# stored and will be sent as it is), of a machine it follows.
_COUNT_LOST = """
    WITH removed AS (
        SELECT CAST(x AS xid8) AS xact_id, i AS id
        FROM unnest(CAST(%(xacts)s AS text[]), CAST(%(ids)s AS bigint[])) AS r(x, i)
    ),
    lost AS (
        SELECT s.name, count(*) AS n
        FROM subscriptions AS s JOIN removed AS r
          ON (r.xact_id, r.id) > (CAST(CAST(s.cursor_xact AS text) AS xid8), s.cursor_id)
         AND (s.batch_last_xact IS NULL
              OR (r.xact_id, r.id)
                 > (CAST(CAST(s.batch_last_xact AS text) AS xid8), s.batch_last_id))
        WHERE s.state_machines IS NULL OR %(sm)s = ANY (s.state_machines)
        GROUP BY s.name
    )
    UPDATE subscriptions SET lost_events = subscriptions.lost_events + lost.n
    FROM lost WHERE subscriptions.name = lost.name
    """

_PRUNED_POSITION = """
    SELECT CAST(pruned_xact AS text) || '-' || pruned_id FROM retention_horizons
    WHERE CAST(%(sm)s AS text) IS NULL OR state_machine = %(sm)s
    ORDER BY pruned_xact DESC, pruned_id DESC
    LIMIT 1
    """
