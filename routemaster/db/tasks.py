"""Pull workers' tasks: acting on claimed labels by task id (claims: ``db/label_claims.py``).

A claim leases labels as the worker's claims do (``due_at`` one lease ahead,
``lease_owner`` set, the attempt counted) and gives each lease a new task id
(``labels.task_id``), recorded in ``tasks``. Every call made with a task id
acts in one statement that also checks the lease: ``task_id = %(id)s``, still
leased (every move and operator command clears ``lease_owner``) and not run
out (``due_at > %(now)s``). A stale id therefore changes nothing, whatever the
order in which two workers call. Statements are written and run as
:mod:`routemaster.db.statements` says.

A task id begins with its label's shard key (``"<shard key>.<random>"``,
:func:`labelled_task_id`), so every call made with it names the shard key
and on Citus runs on the label's shard alone. Ids issued before (random
only: no ``.``) still work, through statements that do not name it (on
Citus those read every shard).

Each write here is a step in a task's life after its label was picked (an id
given, the lease renewed, ended or run out, the due time after), so it lives
here, not with the claims that pick labels; becoming errored is a transition's.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa

from routemaster.db.catalogue import RETURNED, TASK_HOLDER, serialised
from routemaster.db.keys import SHARD_KEYS, label_keys, shard_key
from routemaster.db.labels import Label, label_from_row, serialises
from routemaster.db.statements import fetch_one, run
from routemaster.db.transitions import Erring, become_errored

PullState = tuple[str, str]
"""(state machine, pull action)."""


@dataclass(frozen=True)
class Lease:
    """The lease a claim sets, and where it came from (shown in explanations)."""

    seconds: float
    source: str  # fixed, percentile, min (also: too few completions yet) or max
    samples: int  # completions a percentile was taken over (0 for a fixed lease)


LeasedState = tuple[str, str, Lease]
"""(state machine, pull action, the lease a claim there sets now)."""


@dataclass(frozen=True)
class Task:
    """One claimed label, as ``POST /tasks/claim`` shows it."""

    id: str
    state_machine: str
    label: str
    state: str
    metadata: dict[str, Any]
    attempt: int
    entry_id: int  # the idempotency token a webhook of the same entry would carry
    lease_expires_at: datetime.datetime


@dataclass(frozen=True)
class Held:
    """A label whose lease has run out: to be retried later or errored."""

    state_machine: str
    name: str
    state: str
    task_id: str
    attempts: int
    entry_id: int


@dataclass(frozen=True)
class Expiry:
    """What becomes of one run-out lease: due again at ``due_at``, or errored (``None``)."""

    held: Held
    due_at: datetime.datetime | None
    error: str  # the label's last error, and the history entry's reason when errored


def expire(conn: sa.Connection, expiries: Sequence[Expiry], *, now: datetime.datetime) -> None:
    """End locked run-out leases: each due again at its time, or errored, with its error."""
    if not expiries:
        return
    names = [expiry.held.name for expiry in expiries]
    run(
        conn,
        _EXPIRE,
        {
            "machines": [expiry.held.state_machine for expiry in expiries],
            "names": names,
            "keys": label_keys(names),
            "ids": [expiry.held.task_id for expiry in expiries],
            "due": [expiry.due_at for expiry in expiries],
            "errors": [expiry.error for expiry in expiries],
            "now": now,
        },
    )
    erring = [
        Erring(e.held.state_machine, e.held.name, e.held.entry_id, e.error)
        for e in expiries
        if e.due_at is None
    ]
    become_errored(conn, erring, now=now)


def labelled_task_id(name: str, token: str) -> str:
    """The task id of a lease of label ``name``: its shard key, ``.`` and ``token`` (random)."""
    return f"{shard_key(name)}.{token}"


def shard_key_of_task(task_id: str) -> int | None:
    """The shard key a task id begins with; ``None`` for an id without (issued before 0017)."""
    prefix, dot, _ = task_id.partition(".")
    if not dot or not prefix.isdigit() or len(prefix) > 4:
        return None
    found = int(prefix)
    return found if found < SHARD_KEYS else None


def _task_params(task_id: str) -> dict[str, Any]:
    """A task id's parameters: the id, and the shard key it begins with (None if none)."""
    return {"id": task_id, "shard_key": shard_key_of_task(task_id)}


def heartbeat(
    conn: sa.Connection, task_id: str, *, now: datetime.datetime
) -> datetime.datetime | None:
    """Extend the lease by its length from now; ``None`` when the id holds no live lease."""
    row = fetch_one(conn, _HEARTBEAT, {**_task_params(task_id), "now": now})
    return None if row is None else cast(datetime.datetime, row[0])


def end_task(
    conn: sa.Connection, task_id: str, *, outcome: str, now: datetime.datetime
) -> tuple[Label, int] | None:
    """End the live lease ``task_id`` and lock its label; ``None`` when it holds none.

    Returns the label (its lease ended, still in the action, not due: the
    caller moves it on or says when it is due again) and the task's attempt number.
    """
    statement = _SERIALISED_END_TASK if serialises(conn) else _END_TASK
    row = fetch_one(conn, statement, {**_task_params(task_id), "outcome": outcome, "now": now})
    if row is None:
        return None
    *columns, attempt = row
    return label_from_row(tuple(columns)), int(attempt)


def issued(conn: sa.Connection, task_id: str) -> bool:
    """Whether ``task_id`` was ever issued."""
    return fetch_one(conn, _ISSUED, _task_params(task_id)) is not None


def set_due(
    conn: sa.Connection,
    label: Label,
    *,
    due_at: datetime.datetime,
    now: datetime.datetime,
    error: str | None = None,
    attempts: int | None = None,
) -> Label:
    """After :func:`end_task`: when the label is next due, its last error and attempt count."""
    row = fetch_one(
        conn,
        _SET_DUE,
        {
            "sm": label.state_machine,
            "name": label.name,
            "key": label_keys([label.name])[0],
            "shard_key": shard_key(label.name),
            "due_at": due_at,
            "error": error,
            "attempts": label.attempts if attempts is None else attempts,
            "now": now,
        },
    )
    assert row is not None, "the label is locked by the caller"
    return label_from_row(row)


def give_up(conn: sa.Connection, label: Label, *, error: str, now: datetime.datetime) -> Label:
    """After :func:`end_task`: the label errored with ``error`` (routemaster.db.transitions)."""
    [errored] = become_errored(
        conn, [Erring(label.state_machine, label.name, label.entry_id, error)], now=now
    )
    return errored


def open_callback(
    conn: sa.Connection,
    key: tuple[str, str],
    *,
    entry_id: int,
    task_id: str,
    holder: str,
    lease_seconds: float,
    now: datetime.datetime,
) -> bool:
    """Give a label a webhook worker holds a task id, before its webhook is sent (202 callbacks).

    Whether the label was still held by ``holder`` in entry ``entry_id``.
    """
    opened = run(
        conn,
        _OPEN_CALLBACK,
        {
            "sm": key[0],
            "name": key[1],
            "key": label_keys([key[1]])[0],
            "shard_key": shard_key(key[1]),
            "entry_id": entry_id,
            "id": task_id,
            "holder": holder,
            "lease": lease_seconds,
            "now": now,
        },
    )
    return opened == 1


def hold_for_callback(conn: sa.Connection, task_id: str, *, until: datetime.datetime) -> bool:
    """After a 202: keep the label leased until ``until`` for the receiver to finish the task."""
    return run(conn, _HOLD_FOR_CALLBACK, {**_task_params(task_id), "until": until}) == 1


def claimed_columns(source: str) -> str:
    """What a pull claim's ``claimed`` CTE returns for :data:`TASKS_ISSUED`: each leased
    label's task, with its lease, where it came from and its place ``n``, from ``source``."""
    return (
        "labels.task_id, labels.state_machine, labels.name, labels.state,\n"
        "                  labels.metadata, labels.attempts, labels.entry_id, labels.due_at,\n"
        f"                  {source}.lease, {source}.lease_source, {source}.lease_samples,\n"
        f"                  {source}.n, labels.shard_key"
    )


TASKS_ISSUED = """issued AS (
        INSERT INTO tasks (id, shard_key, state_machine, label, state, entry_id, attempt, worker,
                           lease, claimed_at, lease_source, lease_samples)
        SELECT task_id, shard_key, state_machine, name, state, entry_id, attempts, %(worker)s,
               lease * interval '1 second', %(now)s, lease_source, lease_samples
        FROM claimed
    )
    SELECT task_id AS id, state_machine, name AS label, state, metadata, attempts AS attempt,
           entry_id, due_at AS lease_expires_at
    FROM claimed ORDER BY n"""
"""The end of a claim of pull tasks, after its ``claimed`` CTE (labels leased, each given its
task id and numbered ``n`` in claim order, with their leases): the tasks recorded, and the
claim's answer (:class:`Task` rows, in that order). Every pull claim ends so
(:mod:`routemaster.db.label_claims`, :mod:`routemaster.db.flows`)."""


# Run-out leases: every task ended; labels due again rescheduled here, those to be errored
# left to routemaster.db.transitions (expire runs both in one transaction).
_EXPIRE = """
    WITH expired AS (
        SELECT * FROM unnest(CAST(%(machines)s AS text[]), CAST(%(keys)s AS bytea[]),
                             CAST(%(names)s AS text[]), CAST(%(ids)s AS text[]),
                             CAST(%(due)s AS timestamptz[]), CAST(%(errors)s AS text[]))
                      AS e(sm, key, name, id, due_at, error)
    ), ended AS (
        UPDATE tasks SET ended_at = %(now)s, outcome = 'expired'
        FROM expired WHERE tasks.id = expired.id
    )
    UPDATE labels SET due_at = expired.due_at, last_error = expired.error, lease_owner = NULL,
                      task_id = NULL, updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    FROM expired
    WHERE labels.state_machine = expired.sm AND labels.name_key = expired.key
      AND labels.name = expired.name AND labels.task_id = expired.id
      AND expired.due_at IS NOT NULL
    """

# A live lease, which every call made with a task id checks in its one statement:
# labels.task_id = %(id)s, still leased (every move and operator command clears
# lease_owner), not run out (due_at > %(now)s), and the label neither deleted nor errored.
# Each names the id's shard key, a flag that is NULL for an id issued before 0017 (which
# does not begin with it): PostgreSQL folds the condition away before planning, and on Citus
# a keyed statement runs on its shard alone.
_LABEL_OF_TASK = "(CAST(%(shard_key)s AS integer) IS NULL OR labels.shard_key = %(shard_key)s)"
_TASK_OF_KEY = "(CAST(%(shard_key)s AS integer) IS NULL OR tasks.shard_key = %(shard_key)s)"

# The new lease end is computed in UTC (timestamp + interval): timestamptz + interval is only
# STABLE (it depends on the time zone), which Citus refuses with a column in an UPDATE. A
# lease is a number of seconds, so the two agree.
_HEARTBEAT = f"""
    UPDATE labels SET due_at = timezone('UTC', timezone('UTC', CAST(%(now)s AS timestamptz))
                                               + tasks.lease)
    FROM tasks
    WHERE {_TASK_OF_KEY} AND tasks.id = %(id)s
      AND {_LABEL_OF_TASK} AND labels.task_id = %(id)s
      AND labels.lease_owner IS NOT NULL AND labels.due_at > %(now)s
      AND NOT labels.deleted AND NOT labels.errored
    RETURNING labels.due_at
    """

# The label is returned with its lease ended, followed by the task's attempt number.
# ``shard_key``: the id's (NULL for an id issued before 0017, which does not begin with it).
_END_TASK = f"""
    WITH taken AS (
        UPDATE labels SET lease_owner = NULL, task_id = NULL, due_at = NULL,
                          updated_at = %(now)s,
                          scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                              THEN %(now)s ELSE labels.scheduled_at END
        WHERE {_LABEL_OF_TASK} AND labels.task_id = %(id)s
          AND labels.lease_owner IS NOT NULL AND labels.due_at > %(now)s
          AND NOT labels.deleted AND NOT labels.errored
        RETURNING {RETURNED}
    ), ended AS (
        UPDATE tasks SET ended_at = %(now)s, outcome = %(outcome)s
        FROM taken WHERE {_TASK_OF_KEY} AND tasks.id = %(id)s
        RETURNING tasks.attempt
    )
    SELECT {RETURNED},
           attempt
    FROM taken, ended
    """

# On one server, _END_TASK once the label's writers are serialised (the advisory lock of
# routemaster/db/labels.py), found by the task id: the lease ends and the caller then merges
# the patch (which takes that lock too) and moves the label, so a writer holding the lock
# never waits for this statement's row lock while it waits for the lock.
_SERIALISED_END_TASK = serialised(_END_TASK, TASK_HOLDER)

_ISSUED = f"SELECT 1 FROM tasks WHERE {_TASK_OF_KEY} AND id = %(id)s"

# Becoming errored instead: routemaster.db.transitions (give_up).
_SET_DUE = f"""
    UPDATE labels SET due_at = %(due_at)s, last_error = %(error)s, attempts = %(attempts)s,
                      updated_at = %(now)s,
                      scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                          THEN %(now)s ELSE labels.scheduled_at END
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    RETURNING {RETURNED}
    """

_OPEN_CALLBACK = """
    WITH opened AS (
        UPDATE labels SET task_id = %(id)s
        WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
          AND name = %(name)s AND entry_id = %(entry_id)s AND lease_owner = %(holder)s
          AND NOT deleted AND NOT errored
        RETURNING state_machine, name, state, entry_id, attempts
    )
    INSERT INTO tasks (id, shard_key, state_machine, label, state, entry_id, attempt, worker,
                       lease, claimed_at, lease_source, lease_samples)
    SELECT %(id)s, %(shard_key)s, state_machine, name, state, entry_id, attempts, %(holder)s,
           %(lease)s * interval '1 second', %(now)s, 'fixed', 0
    FROM opened
    """

_HOLD_FOR_CALLBACK = f"""
    UPDATE labels SET due_at = %(until)s
    WHERE {_LABEL_OF_TASK} AND task_id = %(id)s AND lease_owner IS NOT NULL
      AND NOT deleted AND NOT errored
    """
