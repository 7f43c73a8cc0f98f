"""Bulk commands: accepting a job with its fixed set of labels, claiming and recording its work.

A job's labels are copied into ``bulk_items`` in the transaction that
accepts it, so the set is what matched then. Workers claim pending items
with ``FOR UPDATE SKIP LOCKED`` (two workers never take the same item) and
record each outcome in the transaction that changed the label; if a worker
dies mid-batch its transaction rolls back, the items stay pending, and the
next claim takes them again with nothing half done. Items are rows of
``bulk_items``, not labels, so their claim is here rather than with the claims
of labels (:mod:`routemaster.db.label_claims`); on Citus it goes shard by shard
as those do (:func:`routemaster.db.shards.take`).
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from routemaster.db.labels import SERIALISED_AT_MOST
from routemaster.db.notifications import notify_due
from routemaster.db.plumbing.database import distributed
from routemaster.db.search import Search, filter_params, with_condition
from routemaster.db.shards import one_connection_per_node, shard_map, take
from routemaster.db.statements import fetch_all, fetch_one, fetch_value, run

_INSERT_JOB = """
    INSERT INTO bulk_jobs (state_machine, command, arguments, reason, pause_until, total)
    VALUES (%(sm)s, %(command)s, CAST(%(arguments)s AS jsonb), %(reason)s, %(pause_until)s, 0)
    RETURNING id
    """

# A search template (db/search.py): complete SQL but for the compiled condition's slot.
_INSERT_ITEMS = """
    INSERT INTO bulk_items (job_id, shard_key, name_key, name)
    SELECT %(job)s, shard_key, name_key, name FROM labels
    WHERE state_machine = %(sm)s AND NOT deleted
      AND (CAST(%(state)s AS text) IS NULL OR state = %(state)s)
      AND (NOT %(errored)s OR errored)
      AND name_key BETWEEN %(lowest)s AND %(highest)s AND starts_with(name, %(prefix)s)
      AND ({condition})
    """

_SET_TOTAL = """
    UPDATE bulk_jobs SET total = %(total)s,
                         finished_at = CASE WHEN %(total)s = 0 THEN %(now)s END
    WHERE id = %(job)s
    """

_GET_JOB = """
    SELECT id, state_machine, command, arguments, reason, total, done, skipped, failed,
           finished_at, pause_until
    FROM bulk_jobs WHERE id = %(job)s
    """

# The oldest running job's pending items first, in key order (the order labels are locked in).
# ``shard_keys``: NULL on one server; on Citus every key of one shard (routemaster.db.shards).
_CLAIM = """
    SELECT item.job_id, item.name_key, item.name
    FROM bulk_items AS item JOIN bulk_jobs AS job ON job.id = item.job_id
    WHERE (CAST(%(shard_keys)s AS integer[]) IS NULL
           OR item.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))
      AND item.outcome IS NULL AND job.finished_at IS NULL
    ORDER BY item.job_id, item.name_key
    LIMIT %(limit)s
    FOR UPDATE OF item SKIP LOCKED
    """

# On one server, the pending items whose labels' writers this transaction serialises (the
# advisory lock of routemaster/db/labels.py), read without a row lock, so before the
# transaction's id: among the first twice ``limit`` in claim order (another worker's batch
# holds the first ones' locks), up to ``limit`` whose lock is free now, tried without waiting.
_SERIALISE_PENDING = """
    SELECT pending.job_id, pending.name_key
    FROM (SELECT item.job_id, item.name_key, job.state_machine, item.name
          FROM bulk_items AS item JOIN bulk_jobs AS job ON job.id = item.job_id
          WHERE item.outcome IS NULL AND job.finished_at IS NULL
          ORDER BY item.job_id, item.name_key
          LIMIT 2 * %(limit)s OFFSET 0) AS pending
    WHERE pg_try_advisory_xact_lock(hashtext(pending.state_machine), hashtext(pending.name))
    LIMIT %(limit)s
    """

# On one server, _CLAIM of the items whose labels' writers are serialised.
_CLAIM_SERIALISED = """
    SELECT item.job_id, item.name_key, item.name
    FROM bulk_items AS item JOIN bulk_jobs AS job ON job.id = item.job_id
    WHERE (item.job_id, item.name_key) IN (SELECT * FROM unnest(CAST(%(jobs)s AS bigint[]),
                                                                CAST(%(keys)s AS bytea[])))
      AND item.outcome IS NULL AND job.finished_at IS NULL
    ORDER BY item.job_id, item.name_key
    FOR UPDATE OF item SKIP LOCKED
    """

# On Citus (routemaster.db.shards): the shard keys of the first pending items, read without a
# lock across the shards (which shards to visit).
# On Citus: whether any job is running, before reading its items across the shards.
_ANY_RUNNING = "SELECT EXISTS (SELECT 1 FROM bulk_jobs WHERE finished_at IS NULL)"

_PENDING_KEYS = """
    SELECT item.shard_key
    FROM bulk_items AS item JOIN bulk_jobs AS job ON job.id = item.job_id
    WHERE item.outcome IS NULL AND job.finished_at IS NULL
    ORDER BY item.job_id, item.name_key
    LIMIT %(limit)s
    """


_RECORD_OUTCOMES = """
    UPDATE bulk_items AS item SET outcome = handled.outcome
    FROM unnest(CAST(%(keys)s AS bytea[]), CAST(%(outcomes)s AS text[]))
         AS handled (name_key, outcome)
    WHERE item.job_id = %(job)s AND item.name_key = handled.name_key
    """

_COUNT_OUTCOMES = """
    UPDATE bulk_jobs SET done = done + %(done)s, skipped = skipped + %(skipped)s,
                         failed = failed + %(failed)s
    WHERE id = %(job)s
    """

_FINISH = """
    UPDATE bulk_jobs AS job SET finished_at = %(now)s
    WHERE job.id = %(job)s AND job.finished_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM bulk_items AS item WHERE item.job_id = job.id AND item.outcome IS NULL
      )
    """

OUTCOMES = ("done", "skipped", "failed")


class Job(NamedTuple):
    id: int
    state_machine: str
    command: str
    arguments: Mapping[str, Any]
    reason: str
    total: int
    done: int
    skipped: int
    failed: int
    finished_at: datetime.datetime | None
    pause_until: datetime.datetime | None


class Item(NamedTuple):
    job_id: int
    name_key: bytes
    name: str


def accept_job(
    conn: sa.Connection,
    search: Search,
    *,
    command: str,
    arguments: str,
    reason: str,
    now: datetime.datetime,
    pause_until: datetime.datetime | None = None,
) -> tuple[int, int]:
    """Record a job and copy the labels matching ``search`` into it: ``(id, how many)``.

    ``arguments`` is the job's JSON (filters and the command's own arguments);
    ``pause_until`` the end of each label's pause, for ``pause`` only.
    The caller decides, within the same transaction, whether to keep it.
    """
    job = int(
        fetch_value(
            conn,
            _INSERT_JOB,
            {
                "sm": search.machine,
                "command": command,
                "arguments": arguments,
                "reason": reason,
                "pause_until": pause_until,
            },
        )
    )
    items = with_condition(_INSERT_ITEMS, search)
    count = run(conn, items, {**filter_params(search), "job": job})
    run(conn, _SET_TOTAL, {"job": job, "total": count, "now": now})
    notify_due(conn)
    return job, count


def get_job(conn: sa.Connection, job: int) -> Job | None:
    row = fetch_one(conn, _GET_JOB, {"job": job})
    return None if row is None else Job(*row)


def claim_items(conn: sa.Connection, *, limit: int) -> list[Item]:
    """Up to ``limit`` pending items no other transaction holds, locked until this one ends.

    On one server each item's label's writers are serialised first, before the claim takes
    the transaction's id (the advisory lock of :mod:`routemaster.db.labels`, tried without
    waiting: an item whose label is being written, or is in another batch, is left for a
    later batch): docs/architecture.md, "Order within one label". On Citus shard by shard
    (:mod:`routemaster.db.shards`): the oldest running job's pending items first within each
    shard, the shards from a random one on.
    """
    if shard_map(conn) is not None:
        # No job running (the common case): bulk_jobs, a reference table, is read on the
        # coordinator, and the read of pending items across the shards is not sent at all.
        if not fetch_value(conn, _ANY_RUNNING):
            return []
        one_connection_per_node(conn)  # the batch ends writing bulk_jobs, a reference table
        # quiet: a worker's idle rounds skip it until a bulk command notifies (idle_shards)
        rows = take(conn, _PENDING_KEYS, _CLAIM, {"limit": limit}, quiet=True)
        return [Item(*row) for row in rows]
    # One server: the labels' writers serialised before the claim takes the transaction's id.
    limit = min(limit, SERIALISED_AT_MOST)
    serialised = fetch_all(conn, _SERIALISE_PENDING, {"limit": limit})
    if not serialised:
        return []
    params = {"jobs": [job for job, _ in serialised], "keys": [key for _, key in serialised]}
    return [Item(*row) for row in fetch_all(conn, _CLAIM_SERIALISED, params)]


def record_outcomes(
    conn: sa.Connection, job: int, outcomes: Sequence[tuple[bytes, str]], *, now: datetime.datetime
) -> None:
    """Mark the job's items handled (``done``, ``skipped`` or ``failed``) and count them."""
    if not outcomes:
        return
    run(
        conn,
        _RECORD_OUTCOMES,
        {
            "job": job,
            "keys": [key for key, _ in outcomes],
            "outcomes": [outcome for _, outcome in outcomes],
        },
    )
    counts = Counter(outcome for _, outcome in outcomes)
    run(conn, _COUNT_OUTCOMES, {"job": job, **{name: counts[name] for name in OUTCOMES}})
    if not distributed(conn):
        run(conn, _FINISH, {"job": job, "now": now})
    elif not fetch_value(conn, _ANY_PENDING, {"job": job}):  # Citus: bulk_jobs is a reference
        run(conn, _FINISH_ON_CITUS, {"job": job, "now": now})  # table, read apart from items


def forget_finished(
    conn: sa.Connection, *, before: datetime.datetime, limit: int
) -> tuple[int, int]:
    """Delete up to ``limit`` items of jobs finished before ``before``, then those jobs once
    empty (up to ``limit`` too): (items, jobs) deleted. A job's item list may be long, so it
    goes a batch at a time, never in one statement."""
    params = {"before": before, "limit": limit}
    if not distributed(conn):
        return run(conn, _FORGET_ITEMS, params), run(conn, _FORGET_JOBS, params)
    one_connection_per_node(conn)  # bulk_jobs, a reference table, is written after bulk_items
    return run(conn, _FORGET_ITEMS, params), run(conn, _FORGET_JOBS_ON_CITUS, params)


_ANY_PENDING = """
    SELECT EXISTS (SELECT 1 FROM bulk_items WHERE job_id = %(job)s AND outcome IS NULL)
    """

_FINISH_ON_CITUS = """
    UPDATE bulk_jobs SET finished_at = %(now)s WHERE id = %(job)s AND finished_at IS NULL
    """

_FORGET_ITEMS = """
    DELETE FROM bulk_items WHERE (job_id, name_key) IN (
        SELECT item.job_id, item.name_key FROM bulk_items AS item
        WHERE item.job_id IN (
            SELECT id FROM bulk_jobs WHERE finished_at < %(before)s
            ORDER BY finished_at LIMIT %(limit)s)
        LIMIT %(limit)s
    )
    """

_FORGET_JOBS = """
    DELETE FROM bulk_jobs WHERE id IN (
        SELECT job.id FROM bulk_jobs AS job
        WHERE job.finished_at < %(before)s
          AND NOT EXISTS (SELECT 1 FROM bulk_items WHERE bulk_items.job_id = job.id)
        ORDER BY job.finished_at
        LIMIT %(limit)s
    )
    """

# On Citus a correlated subquery on bulk_items under bulk_jobs (a reference table) is refused:
# the jobs with items left among the oldest finished ones are read first.
_FORGET_JOBS_ON_CITUS = """
    WITH old AS MATERIALIZED (
        SELECT id FROM bulk_jobs WHERE finished_at < %(before)s
        ORDER BY finished_at
        LIMIT %(limit)s
    ), busy AS MATERIALIZED (
        SELECT DISTINCT job_id FROM bulk_items WHERE job_id IN (SELECT id FROM old)
    )
    DELETE FROM bulk_jobs WHERE id IN (SELECT id FROM old) AND id NOT IN (SELECT job_id FROM busy)
    """
