"""Machine versions: the definitions processes started with, and the version history rows carry.

A definition is the machine as the API describes it (JSON, no header values
or secrets); its digest is the SHA-256 of its canonical JSON, so the same
definition started again keeps its number. ``history.version`` is named by
every statement that writes history (:mod:`routemaster.db.history`), from the
versions the process runs (:func:`routemaster.db.history.stamp_versions`).
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


def version_of(conn: sa.Connection, machine: str, version: int) -> MachineVersion | None:
    """One recorded version (a ``continue`` machine's label's own, loaded once per process)."""
    row = fetch_one(conn, _ONE_VERSION, {"machine": machine, "version": version})
    return None if row is None else MachineVersion(*row)


def labels_to_abort(
    conn: sa.Connection,
    machine: str,
    *,
    version: int,
    ends: list[str],
    unversioned: bool,
    now: datetime.datetime,
    limit: int,
) -> list[tuple[str, int | None]]:
    """Up to ``limit`` live labels created under a version before ``version``: (name, version).

    Not in an end state (``ends``), not leased by a worker (a delivery in
    flight finishes first). ``unversioned``: also labels with no version
    (created while the machine did not record versions).
    """
    params = {"sm": machine, "v": version, "ends": ends, "now": now, "limit": limit}
    rows = fetch_all(conn, _OLDER_LABELS, params)
    if unversioned and len(rows) < limit:
        rows += fetch_all(conn, _UNVERSIONED_LABELS, {**params, "limit": limit - len(rows)})
    return [(str(name), None if found is None else int(found)) for name, found in rows]


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

_ONE_VERSION = """
    SELECT machine, version, digest, definition, applied_at, last_applied_at
    FROM machine_versions
    WHERE machine = %(machine)s AND version = %(version)s
    """


_OLDER_LABELS = """
    SELECT name, version FROM labels
    WHERE state_machine = %(sm)s AND version < %(v)s AND NOT deleted
      AND NOT (state = ANY(CAST(%(ends)s AS text[])))
      AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
    ORDER BY version, name_key
    LIMIT %(limit)s
    """

_UNVERSIONED_LABELS = """
    SELECT name, version FROM labels
    WHERE state_machine = %(sm)s AND version IS NULL AND NOT deleted
      AND NOT (state = ANY(CAST(%(ends)s AS text[])))
      AND (lease_owner IS NULL OR due_at IS NULL OR due_at <= %(now)s)
    ORDER BY name_key
    LIMIT %(limit)s
    """
