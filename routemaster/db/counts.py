"""Labels counted: live labels grouped per machine and state (or version), each count once.

The console, the API's machine description, ``/metrics``' label gauges and a
configuration's plan all read these. Labels per state are kept
(:mod:`routemaster.db.label_counts`: counts folded from history, plus what
changed since), so reading them costs what changed, not the labels stored;
the others are grouped counts served by a partial index bounded by what they
count (``labels_errored``: errored labels, ``labels_due``: due labels,
``labels_by_version``: labels that keep a version, ``labels_leased``: pull
tasks in flight). Every count per state of the service is here (the console's
tasks in flight too). One machine's labels per version (:func:`versions_beside`)
skip the version in force: its labels are the machine's kept total less the
others, so the read costs the labels still on other versions, not the
machine's labels.
"""

from __future__ import annotations

import datetime
from typing import NamedTuple

import sqlalchemy as sa

from routemaster.db import label_counts
from routemaster.db.statements import fetch_all, fetch_one

StateCounts = dict[tuple[str, str], int]
"""Labels per (machine, state)."""


class StateCount(NamedTuple):
    """In one state: how many live labels, and how many of them errored."""

    labels: int
    errored: int


_PER_STATE = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE NOT deleted
    GROUP BY state_machine, state
    """

_ERRORED_PER_STATE = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE errored AND NOT deleted
    GROUP BY state_machine, state
    """

# Work a worker can take: paused and errored labels keep their due time but are not in the
# backlog (nor in the labels_due index, migration 0019).
_DUE_PER_STATE = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE due_at <= now() AND NOT deleted AND NOT paused AND NOT errored
    GROUP BY state_machine, state
    """

# Pull tasks holding a live lease: the label leased to a task, the lease not run out.
_TASKS_IN_FLIGHT_PER_STATE = """
    SELECT state_machine, state, count(*) FROM labels
    WHERE lease_owner IS NOT NULL AND due_at > %(now)s AND task_id IS NOT NULL
      AND NOT deleted AND NOT errored
    GROUP BY state_machine, state
    """

_IN_MACHINE = """
    SELECT state, count(*), count(*) FILTER (WHERE errored) FROM labels
    WHERE state_machine = %(sm)s AND NOT deleted
    GROUP BY state
    """

_ERRORED_IN_MACHINE = """
    SELECT state, count(*) FROM labels
    WHERE state_machine = %(sm)s AND errored AND NOT deleted
    GROUP BY state
    """

_VERSION_COLUMN_EXISTS = """
    SELECT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = to_regclass('labels') AND attname = 'version'
                     AND NOT attisdropped)
    """

# One machine's live labels that keep a version other than ``beside``, per version: two ranges
# of labels_by_version (state_machine, version, state), never the labels on ``beside``.
_VERSIONS_BESIDE = """
    SELECT version, count(*) FROM labels
    WHERE state_machine = %(sm)s AND (version < %(beside)s OR version > %(beside)s)
      AND NOT deleted
    GROUP BY version
    """

_VERSIONS_IN_MACHINE = """
    SELECT version, count(*) FROM labels
    WHERE state_machine = %(sm)s AND version IS NOT NULL AND NOT deleted
    GROUP BY version
    """


def per_state(conn: sa.Connection) -> StateCounts:
    """Live labels per machine and state (states with none are absent).

    The kept counts; every label counted where they are not kept yet (a
    database ``migrate`` has not seeded, or older than them: ``plan`` runs
    before ``migrate``).
    """
    kept = label_counts.kept_per_state(conn) if label_counts.has_table(conn) else None
    return _grouped(conn, _PER_STATE) if kept is None else kept


def errored_per_state(conn: sa.Connection) -> StateCounts:
    """Live errored labels per machine and state."""
    return _grouped(conn, _ERRORED_PER_STATE)


def due_per_state(conn: sa.Connection) -> StateCounts:
    """Live labels due now (or overdue) per machine and state."""
    return _grouped(conn, _DUE_PER_STATE)


def tasks_in_flight_per_state(conn: sa.Connection, *, now: datetime.datetime) -> StateCounts:
    """Live leases held by pull tasks, per machine and (action) state."""
    rows = fetch_all(conn, _TASKS_IN_FLIGHT_PER_STATE, {"now": now})
    return {(machine, state): int(n) for machine, state, n in rows}


def in_machine(conn: sa.Connection, machine: str) -> dict[str, StateCount]:
    """One machine's live labels, and how many of them errored, per state (none: absent)."""
    kept = label_counts.kept_in_machine(conn, machine)
    if kept is None:
        return {
            state: StateCount(int(labels), int(errored))
            for state, labels, errored in fetch_all(conn, _IN_MACHINE, {"sm": machine})
        }
    errored = {state: int(n) for state, n in fetch_all(conn, _ERRORED_IN_MACHINE, {"sm": machine})}
    return {
        state: StateCount(labels, errored.get(state, 0)) for state, labels in kept.items() if labels
    }


def versions_beside(conn: sa.Connection, machine: str, beside: int | None) -> dict[int, int]:
    """One machine's live labels that keep a version, per version, but for those on ``beside``
    (the version in force: :func:`routemaster.machine.upgrades.labels_by_version` counts them
    as the machine's labels less these); every version when ``beside`` is ``None``."""
    exists = fetch_one(conn, _VERSION_COLUMN_EXISTS, {})
    if not (exists and exists[0]):
        return {}
    if beside is None:
        rows = fetch_all(conn, _VERSIONS_IN_MACHINE, {"sm": machine})
    else:
        rows = fetch_all(conn, _VERSIONS_BESIDE, {"sm": machine, "beside": beside})
    return {int(version): int(count) for version, count in rows}


def _grouped(conn: sa.Connection, statement: str) -> StateCounts:
    return {(machine, state): int(n) for machine, state, n in fetch_all(conn, statement, {})}
