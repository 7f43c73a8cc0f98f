"""A label stopped and started again: errored, retried, paused and resumed."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.catalogue import (
    EACH_LABEL,
    NAMED_KEYS,
    RETURNED,
    RETURNED_FROM_LABELS,
    named_by,
    serialised,
)
from routemaster.db.claimed import Claim
from routemaster.db.history import Entry
from routemaster.db.keys import label_key_arrays, label_keys, shard_keys
from routemaster.db.labels import Label, LabelKey, label_from_row, label_params, serialises
from routemaster.db.notifications import notify_due
from routemaster.db.statements import fetch_all, fetch_one, run
from routemaster.db.transitions.entries import append, append_one, record_forced


@dataclass(frozen=True)
class Erring:
    """A label to error: in the entry it was picked in, with what went wrong."""

    state_machine: str
    name: str
    entry_id: int
    error: str


def become_errored(
    conn: sa.Connection,
    erring: Sequence[Erring],
    *,
    now: datetime.datetime,
    first: bool = False,
) -> list[Label]:
    """Error each label still live, in its entry and not errored: the labels it errored.

    Two statements on every server: the labels' rows (:data:`_ERROR_LABELS`), then their
    history rows (:func:`append`). An error changes neither state nor deletion, so the
    kept counts (folded from history) do not depend on the two being one statement.

    Every path to an error calls it: a webhook given up on (:func:`mark_errored`), a
    pull task failed for the last time or whose lease ran out for the last time
    (``db/tasks.py``), labels left waiting on an open circuit too long
    (``db/receiver_labels.py``). The label's row: errored, not due, its lease and task id
    cleared, the error kept as ``last_error``. Its history entry: ``kind`` ``errored``,
    ``forced`` false, the state as both old and new state, the error as ``reason``, so it
    shows in ``/history`` and on the changes streams; the label's ``entry_id`` (its
    idempotency token) is unchanged.

    ``first``: the transaction reaches these labels first here (it holds none of their
    rows), so on one server their writers are serialised before the rows are locked
    (the condition in ``db/labels.py``). A sweep that picked and holds the rows
    passes ``False``.
    """
    if not erring:
        return []
    names = [each.name for each in erring]
    machines = [each.state_machine for each in erring]
    params = {
        "shard_keys": shard_keys(names),
        "machines": machines,
        "names": names,
        "keys": label_keys(names),
        "entry_ids": [each.entry_id for each in erring],
        "errors": [each.error for each in erring],
        "now": now,
    }
    # The labels, then their history rows, in the caller's transaction: on Citus one label's
    # error is two router statements (a CTE feeding history from the UPDATE would commit in
    # two phases); on one server the second statement costs a round trip on a rare path.
    serialised = first and serialises(conn, len(erring))
    statement = _SERIALISED_ERROR_LABELS if serialised else _ERROR_LABELS
    errored = [label_from_row(row) for row in fetch_all(conn, statement, params)]
    entries = [
        Entry(
            label.state_machine,
            label.name,
            label.state,
            label.state,
            False,
            label.last_error,
            label.version,
            kind="errored",
        )
        for label in errored
    ]
    if len(entries) == 1:
        append_one(conn, entries[0], now=now)
    else:
        append(conn, entries, now=now)
    return errored


def mark_errored(conn: sa.Connection, claim: Claim, *, error: str, now: datetime.datetime) -> bool:
    """Give up on the claimed entry: errored until an operator retries it; whether it was.

    The first write of the caller's transaction (the claim's lease was another's), so the
    label's writers are serialised first (on one server)."""
    erring = Erring(claim.state_machine, claim.name, claim.entry_id, error)
    return bool(become_errored(conn, [erring], now=now, first=True))


# The labels errored, before their history rows (become_errored; the rows' version as
# append gives it): for one label a router statement on Citus.
_ERROR_LABELS = f"""
    WITH erring AS (
        SELECT * FROM unnest({NAMED_KEYS},
                             CAST(%(entry_ids)s AS bigint[]), CAST(%(errors)s AS text[]))
                      AS e(shard_key, sm, key, name, entry_id, error)
    )
    UPDATE labels SET errored = true, due_at = NULL, last_error = erring.error,
                      lease_owner = NULL, task_id = NULL, updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM erring
    WHERE {named_by("erring")}
      AND labels.entry_id = erring.entry_id AND NOT labels.deleted AND NOT labels.errored
    RETURNING {RETURNED_FROM_LABELS}
    """

# On one server, _ERROR_LABELS once the labels' writers are serialised (become_errored's
# ``first``).
_SERIALISED_ERROR_LABELS = serialised(_ERROR_LABELS, EACH_LABEL)


# --- retry -----------------------------------------------------------------------------------


def retry(
    conn: sa.Connection, keys: Sequence[LabelKey], *, now: datetime.datetime, reason: str
) -> list[Label]:
    """Make the errored labels of ``keys`` due again now with a fresh attempt count, in one
    statement, each recorded as forced with ``reason``: every retry (an operator's, a bulk
    command's, those of a receiver's errored labels) is this one. Returns the labels
    retried: those still errored and not deleted once the statement holds their row locks
    (one retried or deleted meanwhile is left alone). The idempotency token (``entry_id``)
    is unchanged: it is still the same entry into the action."""
    if not keys:
        return []
    statement = _SERIALISED_RETRY if serialises(conn, len(keys)) else _RETRY
    rows = fetch_all(conn, statement, {**label_key_arrays(keys), "now": now})
    retried = [label_from_row(row) for row in rows]
    entries = [
        Entry(
            label.state_machine, label.name, label.state, label.state, True, reason, label.version
        )
        for label in retried
    ]
    if len(entries) == 1:
        append_one(conn, entries[0], now=now)
    else:
        append(conn, entries, now=now)
    if retried:
        notify_due(conn)
    return retried


_RETRY = f"""
    UPDATE labels SET errored = false, attempts = 0, due_at = %(now)s, lease_owner = NULL,
                      updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM unnest({NAMED_KEYS})
         AS retried(shard_key, sm, key, name)
    WHERE {named_by("retried")}
      AND labels.errored AND NOT labels.deleted
    RETURNING {RETURNED_FROM_LABELS}
    """

# On one server, _RETRY once the labels' writers are serialised: every caller reaches the
# labels first here, or holds their locks already (an operator's retry locked the label).
_SERIALISED_RETRY = serialised(_RETRY, EACH_LABEL)


# --- pause and resume ------------------------------------------------------------------------


def pause(
    conn: sa.Connection,
    label: Label,
    paused: bool,
    *,
    now: datetime.datetime,
    reason: str,
    until: datetime.datetime | None = None,
) -> Label:
    """Pause (``paused``) or resume the locked ``label``, recorded as forced with ``reason``.

    The pause's end is set either way: ``until`` when pausing (``None``: only when
    resumed), none when resuming. A label already paused (or not) keeps all but that
    end, with no history row.
    """
    end = until if paused else None
    if label.paused == paused:
        run(conn, _SET_PAUSE_END, {**label_params(*label.key), "until": end})
        return label
    record_forced(conn, label, now=now, reason=reason)
    params = {**label_params(*label.key), "paused": paused, "until": end, "now": now}
    row = fetch_one(conn, _SET_PAUSED, params)
    assert row is not None, "the label is locked by the caller"
    updated = label_from_row(row)
    if not paused and updated.due_at is not None:
        notify_due(conn)
    return updated


_SET_PAUSED = f"""
    UPDATE labels SET paused = %(paused)s, paused_until = %(until)s, lease_owner = NULL,
                      updated_at = %(now)s,
                      scheduled_at = CASE WHEN scheduled_at = updated_at
                                          THEN %(now)s ELSE scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    RETURNING {RETURNED}
    """

_SET_PAUSE_END = """
    UPDATE labels SET paused_until = %(until)s
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """
