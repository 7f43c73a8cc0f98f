"""What the store's statements share, written once, and the one rule that derives a variant.

A statement is one module-level constant per operation, beside its function.
What many statements say alike is a named piece here, put in at import time
(an f-string of these constants, never assembled at run time), so each
statement is still complete text once the module is imported:
``tests/db/test_catalogue.py`` prints every statement built from these pieces
and runs ``EXPLAIN`` on each serialised variant.

- :data:`LABEL_COLUMNS` (:data:`RETURNED`, :data:`RETURNED_FROM_LABELS`): a
  label's columns, in the order every statement returning labels lists them.
- :data:`CLAIMABLE` (:data:`LABELS_CLAIMABLE`): the rest of the predicate of
  the partial indexes ``labels_due`` and ``labels_claimable`` (after
  ``due_at``), which a claim names whole so that PostgreSQL may read them.
- :data:`IN_SHARD` (:data:`LABELS_IN_SHARD`): a statement run shard by shard
  on Citus (``%(shard_keys)s`` every key of one shard; NULL on one server,
  where the condition folds away: :mod:`routemaster.db.shards`).

**A variant is a flag or a derivation.** Where the plan is the same, a
variant is a parameter inside the one statement (``CAST(%(x)s AS ...) IS NULL
OR ...``, which PostgreSQL folds away before planning, since the driver sends
the value as a literal). Where it is not, the variant is derived from its
base by one named rule, never written by hand: :func:`serialised`, the
statement once its labels' writers are serialised (:mod:`routemaster.db.labels`
says why), is the base with one advisory-lock condition put last in its first
``WHERE`` clause, which PostgreSQL evaluates before it locks or writes the
row.
"""

from __future__ import annotations

import textwrap

LABEL_COLUMNS = (
    "state_machine",
    "name",
    "metadata",
    "state",
    "state_entered_at",
    "entry_id",
    "previous_state",
    "deleted",
    "paused",
    "errored",
    "last_error",
    "attempts",
    "due_at",
    "created_at",
    "updated_at",
    "version",
)
"""A label row's columns, in the order every statement that returns labels lists them."""


def _listed(columns: list[str]) -> str:
    """``columns`` comma-separated, wrapped so that a printed statement stays readable."""
    return textwrap.fill(", ".join(columns), width=84, subsequent_indent=" " * 10)


RETURNED = _listed(list(LABEL_COLUMNS))
"""A label's columns (:data:`LABEL_COLUMNS`), as a statement on ``labels`` alone lists them."""

RETURNED_FROM_LABELS = _listed([f"labels.{column}" for column in LABEL_COLUMNS])
"""A label's columns qualified by ``labels.``, for a statement that joins other rows."""

CLAIMABLE = "NOT deleted AND NOT paused AND NOT errored"
"""A claimable label, but for its due time: the partial indexes' predicate (migration 0019)."""

LABELS_CLAIMABLE = "NOT labels.deleted AND NOT labels.paused AND NOT labels.errored"
""":data:`CLAIMABLE`, qualified by ``labels.``."""

IN_SHARD = (
    "(CAST(%(shard_keys)s AS integer[]) IS NULL\n"
    "           OR shard_key = ANY(CAST(%(shard_keys)s AS integer[])))"
)
"""Rows of the shard whose keys are ``%(shard_keys)s``; every row when it is NULL."""

LABELS_IN_SHARD = (
    "(CAST(%(shard_keys)s AS integer[]) IS NULL\n"
    "           OR labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[])))"
)
""":data:`IN_SHARD`, qualified by ``labels.``."""


# --- serialised: the one rule of a variant whose plan differs --------------------------------

ONE_LABEL = "pg_advisory_xact_lock(hashtext(%(sm)s), hashtext(%(name)s)) IS NOT NULL"
"""The advisory lock of the label ``%(sm)s``, ``%(name)s``."""

EACH_LABEL = """(SELECT count(pg_advisory_xact_lock(in_order.sm_hash, in_order.name_hash))
 FROM (SELECT DISTINCT hashtext(w.sm) AS sm_hash, hashtext(w.name) AS name_hash
       FROM unnest(CAST(%(machines)s AS text[]), CAST(%(names)s AS text[]))
            AS w(sm, name)
       ORDER BY sm_hash, name_hash OFFSET 0) AS in_order) IS NOT NULL"""
"""The advisory lock of each label of ``%(machines)s`` and ``%(names)s``: in one order for every
statement (by its two keys, so two labels whose keys collide are one lock in one place), all of
them before the statement locks or writes a row, since its first row takes the transaction's id
(an uncorrelated subquery, evaluated once)."""

TASK_HOLDER = """(SELECT count(pg_advisory_xact_lock(hashtext(held.state_machine),
                                        hashtext(held.name)))
 FROM labels AS held
 WHERE (CAST(%(shard_key)s AS integer) IS NULL OR held.shard_key = %(shard_key)s)
   AND held.task_id = %(id)s) IS NOT NULL"""
"""The advisory lock of the label leased to task ``%(id)s`` (found by the task id)."""

_WHERE_ENDS = ("RETURNING", "ORDER BY", "FOR UPDATE", "GROUP BY", "LIMIT", ")")


def serialised(statement: str, lock: str) -> str:
    """``statement`` once its labels' writers are serialised: ``lock`` (:data:`ONE_LABEL`,
    :data:`EACH_LABEL` or :data:`TASK_HOLDER`) put last in its first ``WHERE`` clause.

    Only in a statement with which a transaction first reaches its labels: one already
    holding a label's row must not wait for a lock of its writers, who may wait for that row.
    """
    lines = statement.split("\n")
    where = next(n for n, line in enumerate(lines) if line.lstrip().startswith("WHERE "))
    indent = len(lines[where]) - len(lines[where].lstrip()) + 2
    end = next(
        n
        for n in range(where + 1, len(lines))
        if lines[n].lstrip().startswith(_WHERE_ENDS) or not lines[n].strip()
    )
    first, *rest = lock.split("\n")
    added = [" " * indent + "AND " + first] + [" " * (indent + 4) + line for line in rest]
    return "\n".join(lines[:end] + added + lines[end:])


# --- labels named by key arrays ------------------------------------------------------------

NAMED_KEYS = """CAST(%(shard_keys)s AS integer[]), CAST(%(machines)s AS text[]),
                CAST(%(keys)s AS bytea[]), CAST(%(names)s AS text[])"""
"""The arrays naming labels (:func:`routemaster.db.keys.label_key_arrays`), to ``unnest``."""


def named_by(alias: str) -> str:
    """Labels named by the rows ``alias`` of an ``unnest`` of :data:`NAMED_KEYS`: found by
    primary key and checked by full name, and on Citus on their shards alone."""
    return (
        "labels.shard_key = ANY(CAST(%(shard_keys)s AS integer[]))\n"
        f"      AND labels.shard_key = {alias}.shard_key AND labels.state_machine = {alias}.sm\n"
        f"      AND labels.name_key = {alias}.key AND labels.name = {alias}.name"
    )
