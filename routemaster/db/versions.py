"""Machine versions: the definitions processes started with, and the version history rows carry.

A definition is the machine as the API describes it (JSON, no header values
or secrets); its digest is the SHA-256 of its canonical JSON, so the same
definition started again keeps its number. ``history.version`` is filled in
by a trigger (migration 0008) from the session setting that
:func:`stamp_connections` puts on each of a process's connections.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.statements import fetch_all, fetch_one


@dataclass(frozen=True)
class MachineVersion:
    machine: str
    version: int
    digest: str
    definition: dict[str, Any]
    applied_at: datetime.datetime
    last_applied_at: datetime.datetime


def digest_of(definition: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the definition's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_version(conn: sa.Connection, machine: str, definition: Mapping[str, Any]) -> int:
    """The version number of ``definition``: its existing one, or the next for a new digest.

    Marks it as the machine's last applied definition. Callers serialise
    with the configuration lock (:mod:`routemaster.db.config_migrations`).
    """
    row = fetch_one(
        conn,
        _RECORD,
        {
            "machine": machine,
            "digest": digest_of(definition),
            "definition": json.dumps(definition),
        },
    )
    assert row is not None
    return int(row[0])


def last_applied(conn: sa.Connection) -> dict[str, MachineVersion]:
    """Per machine, the definition a process started with most recently.

    Empty on a database whose schema predates versions (not migrated yet).
    """
    exists = fetch_one(conn, _TABLE_EXISTS, {})
    if not (exists and exists[0]):
        return {}
    return {row[0]: MachineVersion(*row) for row in fetch_all(conn, _LAST_APPLIED, {})}


def versions_of(
    conn: sa.Connection, machine: str, *, after: int, limit: int
) -> list[MachineVersion]:
    """The machine's versions numbered above ``after``, oldest first, at most ``limit``."""
    rows = fetch_all(conn, _VERSIONS, {"machine": machine, "after": after, "limit": limit})
    return [MachineVersion(*row) for row in rows]


def label_counts(conn: sa.Connection) -> dict[str, dict[str, int]]:
    """Live labels per machine and state: one grouped count (an index-only scan)."""
    counts: dict[str, dict[str, int]] = {}
    for machine, state, count in fetch_all(conn, _COUNTS, {}):
        counts.setdefault(machine, {})[state] = int(count)
    return counts


def stamp_connections(engine: sa.Engine, versions: Mapping[str, int]) -> None:
    """Every new connection of ``engine`` records ``versions`` (machine -> version) in history.

    Set once per connection, committed so that the pool's rollback on
    check-in does not undo it.
    """
    setting = json.dumps(dict(versions), sort_keys=True)

    def stamp(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(_SET_VERSIONS, {"versions": setting})
        cursor.close()
        if not dbapi_connection.autocommit:
            dbapi_connection.commit()

    sa.event.listen(engine, "connect", stamp)


_RECORD = """
    WITH seen AS (
        UPDATE machine_versions SET last_applied_at = clock_timestamp()
        WHERE machine = %(machine)s AND digest = %(digest)s
        RETURNING version
    ), created AS (
        INSERT INTO machine_versions (machine, version, digest, definition, applied_at,
                                      last_applied_at)
        SELECT %(machine)s,
               COALESCE((SELECT max(version) FROM machine_versions
                         WHERE machine = %(machine)s), 0) + 1,
               %(digest)s, CAST(%(definition)s AS jsonb), clock_timestamp(), clock_timestamp()
        WHERE NOT EXISTS (SELECT 1 FROM seen)
        RETURNING version
    )
    SELECT version FROM seen UNION ALL SELECT version FROM created
    """

_TABLE_EXISTS = "SELECT to_regclass('machine_versions') IS NOT NULL"

_LAST_APPLIED = """
    SELECT DISTINCT ON (machine) machine, version, digest, definition, applied_at, last_applied_at
    FROM machine_versions
    ORDER BY machine, last_applied_at DESC, version DESC
    """

_VERSIONS = """
    SELECT machine, version, digest, definition, applied_at, last_applied_at
    FROM machine_versions
    WHERE machine = %(machine)s AND version > %(after)s
    ORDER BY version
    LIMIT %(limit)s
    """

_COUNTS = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE NOT deleted
    GROUP BY state_machine, state
    """

_SET_VERSIONS = "SELECT set_config('routemaster.versions', %(versions)s, false)"
