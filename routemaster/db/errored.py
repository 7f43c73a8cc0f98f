"""A label becoming errored: the label's row and its history entry, in one statement.

Becoming errored is not an entry into a state: the history row has ``kind``
``errored``, ``forced`` false, the action as both old and new state, and the
last error as its ``reason``, so it shows in ``/history`` and on the changes
streams, and the label's ``entry_id`` (its idempotency token) is unchanged.
"""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster.db.claims import Claim
from routemaster.db.keys import label_key
from routemaster.db.statements import run

_MARK_ERRORED = """
    WITH errored AS (
        UPDATE labels SET errored = true, due_at = NULL, last_error = %(error)s,
                          lease_owner = NULL, updated_at = now(),
                          scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                              THEN now() ELSE labels.scheduled_at END
        WHERE state_machine = %(sm)s AND name_key = %(key)s AND name = %(name)s
          AND entry_id = %(entry_id)s AND NOT deleted AND NOT errored
        RETURNING state_machine, name, state
    )
    INSERT INTO history (state_machine, label, old_state, new_state, created, forced, reason,
                         kind)
    SELECT state_machine, name, state, state, %(now)s, false, %(error)s, 'errored' FROM errored
    """


def mark_errored(conn: sa.Connection, claim: Claim, *, error: str, now: datetime.datetime) -> bool:
    """Give up on the claimed entry: errored until an operator retries it; whether it was."""
    params = {
        "sm": claim.state_machine,
        "name": claim.name,
        "key": label_key(claim.name),
        "entry_id": claim.entry_id,
        "error": error,
        "now": now,
    }
    return run(conn, _MARK_ERRORED, params) == 1
