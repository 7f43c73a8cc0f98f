"""History rows that go with no change of state (an operator's forced entry, an error, a
retry, a pause)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import sqlalchemy as sa

from routemaster.db.history import Entry, version_for
from routemaster.db.keys import shard_key, shard_keys
from routemaster.db.labels import Label
from routemaster.db.statements import run


def append(conn: sa.Connection, entries: Sequence[Entry], *, now: datetime.datetime) -> None:
    """Append ``entries`` to history, in one statement."""
    if not entries:
        return
    machines = [entry.state_machine for entry in entries]
    names = [entry.label for entry in entries]
    run(
        conn,
        _APPEND,
        {
            "shard_keys": shard_keys(names),
            "machines": machines,
            "names": names,
            "olds": [entry.old_state for entry in entries],
            "news": [entry.new_state for entry in entries],
            "forceds": [entry.forced for entry in entries],
            "reasons": [entry.reason for entry in entries],
            "kinds": [entry.kind for entry in entries],
            "versions": [
                version_for(conn, entry.state_machine, entry.label_version) for entry in entries
            ],
            "now": now,
        },
    )


def append_one(conn: sa.Connection, entry: Entry, *, now: datetime.datetime) -> None:
    """One row of :func:`append`, through a statement naming one shard key (a router insert)."""
    run(
        conn,
        _APPEND_ONE,
        {
            "shard_key": shard_key(entry.label),
            "sm": entry.state_machine,
            "name": entry.label,
            "old": entry.old_state,
            "new": entry.new_state,
            "forced": entry.forced,
            "reason": entry.reason,
            "kind": entry.kind,
            "version": version_for(conn, entry.state_machine, entry.label_version),
            "now": now,
        },
    )


def record_forced(
    conn: sa.Connection, label: Label, *, now: datetime.datetime, reason: str
) -> None:
    """An operator command that keeps the state, recorded for the audit trail."""
    entry = Entry(
        label.state_machine, label.name, label.state, label.state, True, reason, label.version
    )
    append_one(conn, entry, now=now)


_APPEND = """
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, kind, version, xact_id)
    SELECT shard_key, sm, name, old, new, %(now)s, forced, reason, kind, version,
           routemaster_xact_id()
    FROM unnest(CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(names)s AS text[]), CAST(%(olds)s AS text[]), CAST(%(news)s AS text[]),
                CAST(%(forceds)s AS boolean[]), CAST(%(reasons)s AS text[]),
                CAST(%(kinds)s AS text[]), CAST(%(versions)s AS integer[]))
         AS e(shard_key, sm, name, old, new, forced, reason, kind, version)
    """

_APPEND_ONE = """
    INSERT INTO history (shard_key, state_machine, label, old_state, new_state, created, forced,
                         reason, kind, version, xact_id)
    VALUES (%(shard_key)s, %(sm)s, %(name)s, %(old)s, %(new)s, %(now)s, %(forced)s, %(reason)s,
            %(kind)s, %(version)s, routemaster_xact_id())
    """
