"""A label created, and its metadata merged (by an update; a pull task's completion merges
in :mod:`routemaster.db.transitions.completion`)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import ONE_LABEL, RETURNED, serialised
from routemaster.db.history import version_for
from routemaster.db.labels import Label, label_from_row, label_params, serialises
from routemaster.db.notifications import notify_due_times
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import Prepared, fetch_one, run


def insert(
    conn: sa.Connection,
    state_machine: str,
    name: str,
    metadata: dict[str, Any],
    *,
    state: str,
    now: datetime.datetime,
    due: bool = False,
    due_at: datetime.datetime | None = None,
    next_check_at: datetime.datetime | None = None,
    version: int | None = None,
) -> Label | None:
    """A new label and its first history entry; ``None`` when the name is taken.

    When the worker first looks at it: ``due_at`` (a gate evaluated at
    moments: its schedule), else now if ``due`` (an action); ``next_check_at``:
    a gate's next check (SPEC E1). ``version``: the machine version it is created
    under, kept only for machines whose labels keep it (``upgrade_strategy: continue``
    or ``abort``).
    """
    if due_at is None and due:
        due_at = now
    params = {
        **label_params(state_machine, name),
        "metadata": json.dumps(metadata),
        "state": state,
        "now": now,
        "due_at": due_at,
        "next_check_at": next_check_at,
        "version": version,
        "history_version": version_for(conn, state_machine, version),
    }
    if distributed(conn):
        row = fetch_one(conn, _INSERT_LABEL, params)
        if row is not None:
            run(conn, _INSERT_FIRST_ENTRY, {**params, "entry_id": row[5]})
    else:
        row = fetch_one(conn, _PREPARED_INSERT, params)
    if row is not None:
        notify_due_times(conn, [due_at], now=now)
    return None if row is None else label_from_row(row)


_INSERT_LABEL = f"""
    INSERT INTO labels (shard_key, state_machine, name, name_key, metadata, state,
                        state_entered_at, entry_id, due_at, next_check_at, created_at,
                        updated_at, scheduled_at, version)
    VALUES (%(shard_key)s, %(sm)s, %(name)s, %(key)s, CAST(%(metadata)s AS jsonb), %(state)s,
            %(now)s, nextval(pg_get_serial_sequence('history', 'id')), %(due_at)s,
            %(next_check_at)s, %(now)s, %(now)s, %(now)s, %(version)s)
    ON CONFLICT (state_machine, name_key, shard_key) DO NOTHING
    RETURNING {RETURNED}
    """
"""On Citus, :data:`_INSERT`'s label alone: a router statement (:func:`insert`)."""

_INSERT_FIRST_ENTRY = """
    INSERT INTO history (id, shard_key, state_machine, label, old_state, new_state, created,
                         version, xact_id)
    VALUES (%(entry_id)s, %(shard_key)s, %(sm)s, %(name)s, NULL, %(state)s, %(now)s,
            %(history_version)s, routemaster_xact_id())
    """
"""On Citus, :data:`_INSERT`'s first history entry, in the same transaction (:func:`insert`)."""

# The create: the label and its first history entry in one statement (on one server).
_INSERT = f"""
    WITH created AS ({_INSERT_LABEL}), entry AS (
        INSERT INTO history (id, shard_key, state_machine, label, old_state, new_state, created,
                             version, xact_id)
        SELECT entry_id, %(shard_key)s, state_machine, name, NULL, state, state_entered_at,
               %(history_version)s, routemaster_xact_id()
        FROM created
    )
    SELECT {RETURNED}
    FROM created
    """

# The API's create, prepared once per connection (see routemaster.db.statements).
_PREPARED_INSERT = Prepared("routemaster_label_insert", _INSERT)


# --- merge metadata --------------------------------------------------------------------------


def merge_metadata(
    conn: sa.Connection,
    state_machine: str,
    name: str,
    patch: dict[str, Any],
    *,
    now: datetime.datetime,
    scheduled_states: Sequence[str] = (),
) -> Label | None:
    """Deep-merge ``patch`` into a live label's metadata; ``None`` if there is no such label.

    The row lock the UPDATE takes serialises concurrent merges: none is lost.
    A label in one of ``scheduled_states`` (gates evaluated at moments) is left
    for the caller to reschedule in the same transaction
    (:func:`routemaster.db.schedules.schedule`).
    """
    params = {
        **label_params(state_machine, name),
        "patch": json.dumps(patch),
        "scheduled_states": list(scheduled_states),
        "now": now,
    }
    statement = _SERIALISED_MERGE_METADATA if serialises(conn) else _MERGE_METADATA
    row = fetch_one(conn, statement, params)
    return None if row is None else label_from_row(row)


_MERGE_METADATA = f"""
    UPDATE labels SET metadata = routemaster_deep_merge(metadata, CAST(%(patch)s AS jsonb)),
                      updated_at = %(now)s,
                      scheduled_at = CASE
                          WHEN state = ANY(CAST(%(scheduled_states)s AS text[])) THEN scheduled_at
                          WHEN scheduled_at = updated_at THEN %(now)s
                          ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND NOT deleted
    RETURNING {RETURNED}
    """
"""On Citus, the merge: the coordinator takes the transaction id after the worker granted the
row lock, so the UPDATE may take the lock itself."""

_SERIALISED_MERGE_METADATA = serialised(_MERGE_METADATA, ONE_LABEL)
"""On one server, the merge once the label's writers are serialised (the advisory lock of
:mod:`routemaster.db.labels`, which says why)."""
