"""The delivery log: one row per outbound call, written after the call, read newest first.

Rows are written in batches (one statement for many calls) in the short
transaction that records what the calls came to, never while a call is in
flight. Listings page by ``id`` descending (``before``), so a page costs an
index range scan whatever the table's size; pruning deletes the oldest rows
(lowest ids) in bounded batches.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.keys import label_key


@dataclass(frozen=True)
class Delivery:
    kind: str  # webhook, feed, subscription
    state_machine: str | None
    label: str | None
    state: str | None
    url: str  # redacted
    receiver: str
    attempt: int | None
    trigger: str  # scheduled, retry, manual, probe
    started_at: datetime.datetime
    duration_ms: int
    status: int | None
    outcome: str
    error: str | None
    response_excerpt: str | None
    id: int | None = None  # None until written


@dataclass(frozen=True)
class DeliveryFilter:
    kind: str | None = None
    outcome: str | None = None
    receiver: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None


_FIELDS = (
    "kind",
    "state_machine",
    "label",
    "state",
    "url",
    "receiver",
    "attempt",
    "trigger",
    "started_at",
    "duration_ms",
    "status",
    "outcome",
    "error",
    "response_excerpt",
)

_INSERT = sa.text(
    """
    INSERT INTO deliveries (kind, state_machine, label, state, url, receiver, attempt, trigger,
                            started_at, duration_ms, status, outcome, error, response_excerpt)
    SELECT * FROM unnest(
        CAST(:kind AS text[]), CAST(:state_machine AS text[]), CAST(:label AS text[]),
        CAST(:state AS text[]), CAST(:url AS text[]), CAST(:receiver AS text[]),
        CAST(:attempt AS integer[]), CAST(:trigger AS text[]),
        CAST(:started_at AS timestamptz[]), CAST(:duration_ms AS integer[]),
        CAST(:status AS integer[]), CAST(:outcome AS text[]), CAST(:error AS text[]),
        CAST(:response_excerpt AS text[]))
    """
)

_COLUMNS = (
    "id, kind, state_machine, label, state, url, receiver, attempt, trigger, started_at, "
    "duration_ms, status, outcome, error, response_excerpt"
)

_OF_LABEL = sa.text(
    f"""
    SELECT {_COLUMNS} FROM deliveries
    WHERE state_machine = :sm AND routemaster_label_key(label) = :key AND label = :name
      AND label IS NOT NULL AND id < :before
    ORDER BY id DESC LIMIT :limit
    """
)

_MATCHING = sa.text(
    f"""
    SELECT {_COLUMNS} FROM deliveries
    WHERE id < :before
      AND (CAST(:kind AS text) IS NULL OR kind = :kind)
      AND (CAST(:outcome AS text) IS NULL OR outcome = :outcome)
      AND (CAST(:receiver AS text) IS NULL OR receiver = :receiver)
      AND (CAST(:since AS timestamptz) IS NULL OR started_at >= :since)
      AND (CAST(:until AS timestamptz) IS NULL OR started_at < :until)
    ORDER BY id DESC LIMIT :limit
    """
)

# Among the latest ``:window`` calls only, so a log of successes is not read to its start.
_RECENT_FAILURES = sa.text(
    f"""
    SELECT {_COLUMNS} FROM deliveries
    WHERE outcome NOT IN ('delivered', 'accepted')
      AND id > (SELECT COALESCE(max(id), 0) FROM deliveries) - :window
    ORDER BY id DESC LIMIT :limit
    """
)

_PRUNE = sa.text(
    """
    DELETE FROM deliveries WHERE id IN (
        SELECT id FROM (SELECT id, started_at FROM deliveries ORDER BY id LIMIT :batch) AS oldest
        WHERE started_at < :cutoff
    )
    """
)

_NEWEST = 2**63 - 1


def record(conn: sa.Connection, deliveries: Sequence[Delivery]) -> None:
    """Append ``deliveries`` to the log, in one statement."""
    if deliveries:
        conn.execute(
            _INSERT,
            {name: [getattr(delivery, name) for delivery in deliveries] for name in _FIELDS},
        )


def of_label(
    conn: sa.Connection, state_machine: str, name: str, *, limit: int, before: int | None = None
) -> list[Delivery]:
    """The label's deliveries, newest first, below id ``before``."""
    rows = conn.execute(
        _OF_LABEL,
        {
            "sm": state_machine,
            "key": label_key(name),
            "name": name,
            "before": _NEWEST if before is None else before,
            "limit": limit,
        },
    ).all()
    return [Delivery(**row._mapping) for row in rows]


def matching(
    conn: sa.Connection, where: DeliveryFilter, *, limit: int, before: int | None = None
) -> list[Delivery]:
    """Deliveries that pass ``where``, newest first, below id ``before``."""
    rows = conn.execute(
        _MATCHING,
        {
            "kind": where.kind,
            "outcome": where.outcome,
            "receiver": where.receiver,
            "since": where.since,
            "until": where.until,
            "before": _NEWEST if before is None else before,
            "limit": limit,
        },
    ).all()
    return [Delivery(**row._mapping) for row in rows]


def recent_failures(conn: sa.Connection, *, limit: int, window: int = 10_000) -> list[Delivery]:
    """The latest calls that were not answered with success, among the last ``window``."""
    rows = conn.execute(_RECENT_FAILURES, {"limit": limit, "window": window}).all()
    return [Delivery(**row._mapping) for row in rows]


def prune(conn: sa.Connection, *, cutoff: datetime.datetime, batch: int) -> int:
    """Delete up to ``batch`` of the oldest deliveries started before ``cutoff``: how many."""
    return conn.execute(_PRUNE, {"cutoff": cutoff, "batch": batch}).rowcount
