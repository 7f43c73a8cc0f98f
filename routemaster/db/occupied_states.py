"""Which states hold live labels, found from an index; labels counted only where asked.

``plan`` and the check ``serve``, ``cron`` and ``migrate`` make at start-up
need to know which states hold labels, and how many only in the few states
that matter to them (those the configuration lacks or changes). Counting
every live label to learn that costs a read of every label (0.7 s at a
million); this module costs one index probe per state that holds labels.

:func:`occupied` walks ``labels_by_state`` (``state_machine, state,
name_key`` of live labels) as a loose index scan: each step asks for the
first entry after the (machine, state) found last, so it reads one entry per
state, whatever the labels. The steps are separate statements rather than
one recursive query so that they run the same way on Citus, where each is a
``LIMIT 1`` every shard answers from its own index, merged by the coordinator.
"""

from __future__ import annotations

import sqlalchemy as sa

from routemaster.db.statements import fetch_all, fetch_one

# The first (machine, state) after the given one that holds a live label: one step along
# labels_by_state (an index-only scan that stops at its first entry).
_NEXT_OCCUPIED = """
    SELECT state_machine, state FROM labels
    WHERE NOT deleted AND (state_machine, state) > (%(sm)s, %(state)s)
    ORDER BY state_machine, state
    LIMIT 1
    """

_VERSION_COLUMN_EXISTS = """
    SELECT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = to_regclass('labels') AND attname = 'version'
                     AND NOT attisdropped)
    """

# Live labels in one state, per version they keep (NULL: none), along labels_by_state.
_IN_STATE_BY_VERSION = """
    SELECT version, count(*) FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted
    GROUP BY version
    """

# The same on a schema from before labels had versions (``plan`` runs before ``migrate``).
_IN_STATE = """
    SELECT NULL, count(*) FROM labels
    WHERE state_machine = %(sm)s AND state = %(state)s AND NOT deleted
    """

# Live labels of one machine that keep a version other than ``version``, per version: two
# ranges of labels_by_version (state_machine, version, state), never the labels on ``version``.
_OTHER_VERSIONS = """
    SELECT version, count(*) FROM labels
    WHERE state_machine = %(sm)s AND (version < %(version)s OR version > %(version)s)
      AND NOT deleted
    GROUP BY version
    """


def occupied(conn: sa.Connection) -> dict[str, list[str]]:
    """Per machine, the states that hold at least one live label, in order."""
    found: dict[str, list[str]] = {}
    after = ("", "")
    while (row := fetch_one(conn, _NEXT_OCCUPIED, {"sm": after[0], "state": after[1]})) is not None:
        machine, state = str(row[0]), str(row[1])
        found.setdefault(machine, []).append(state)
        after = (machine, state)
    return found


def versions_exist(conn: sa.Connection) -> bool:
    """Whether labels keep versions (migration 0015; ``plan`` runs before ``migrate``)."""
    row = fetch_one(conn, _VERSION_COLUMN_EXISTS, {})
    return bool(row and row[0])


def in_state(conn: sa.Connection, machine: str, state: str) -> dict[int | None, int]:
    """Live labels in one state, per version they keep (``None``: none kept)."""
    statement = _IN_STATE_BY_VERSION if versions_exist(conn) else _IN_STATE
    return {
        None if version is None else int(version): int(count)
        for version, count in fetch_all(conn, statement, {"sm": machine, "state": state})
        if count
    }


def other_versions(conn: sa.Connection, machine: str, version: int) -> dict[int, int]:
    """Live labels of ``machine`` that keep a version other than ``version``, per version."""
    if not versions_exist(conn):
        return {}
    return {
        int(found): int(count)
        for found, count in fetch_all(conn, _OTHER_VERSIONS, {"sm": machine, "version": version})
    }
