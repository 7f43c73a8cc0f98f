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
from typing import Protocol

import sqlalchemy as sa

from routemaster.db.keys import label_key, shard_key
from routemaster.db.statements import fetch_all, run


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


class OutboundCall(Protocol):
    """What the log takes from a finished call (``routemaster.http.calls.Call`` is one)."""

    @property
    def url(self) -> str: ...
    @property
    def started_at(self) -> datetime.datetime: ...
    @property
    def duration_ms(self) -> int: ...
    @property
    def status(self) -> int | None: ...
    @property
    def outcome(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def excerpt(self) -> str | None: ...


def entry_for(
    call: OutboundCall,
    *,
    kind: str,
    receiver: str,
    trigger: str,
    attempt: int | None,
    state_machine: str | None,
    label: str | None,
    state: str | None,
) -> Delivery:
    """The log entry of ``call``: what it came to, with who made it and why."""
    return Delivery(
        kind=kind,
        state_machine=state_machine,
        label=label,
        state=state,
        url=call.url,
        receiver=receiver,
        attempt=attempt,
        trigger=trigger,
        started_at=call.started_at,
        duration_ms=call.duration_ms,
        status=call.status,
        outcome=call.outcome,
        error=call.error,
        response_excerpt=call.excerpt,
    )


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

# A delivery's shard key is its label's (co-located with it on Citus); a subscription's batch,
# which has no label, takes its receiver's (migration 0017).
_INSERT = """
    INSERT INTO deliveries (shard_key, kind, state_machine, label, state, url, receiver, attempt,
                            trigger, started_at, duration_ms, status, outcome, error,
                            response_excerpt)
    SELECT * FROM unnest(
        CAST(%(shard_key)s AS integer[]), CAST(%(kind)s AS text[]),
        CAST(%(state_machine)s AS text[]), CAST(%(label)s AS text[]),
        CAST(%(state)s AS text[]), CAST(%(url)s AS text[]), CAST(%(receiver)s AS text[]),
        CAST(%(attempt)s AS integer[]), CAST(%(trigger)s AS text[]),
        CAST(%(started_at)s AS timestamptz[]), CAST(%(duration_ms)s AS integer[]),
        CAST(%(status)s AS integer[]), CAST(%(outcome)s AS text[]), CAST(%(error)s AS text[]),
        CAST(%(response_excerpt)s AS text[]))
    """

# Each read returns a delivery's columns in the order of :class:`Delivery`'s fields.

_OF_LABEL = """
    SELECT kind, state_machine, label, state, url, receiver, attempt, trigger, started_at,
           duration_ms, status, outcome, error, response_excerpt, id
    FROM deliveries
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s
      AND routemaster_label_key(label) = %(key)s
      AND label = %(name)s AND label IS NOT NULL AND id < %(before)s
    ORDER BY id DESC LIMIT %(limit)s
    """

_MATCHING = """
    SELECT kind, state_machine, label, state, url, receiver, attempt, trigger, started_at,
           duration_ms, status, outcome, error, response_excerpt, id
    FROM deliveries
    WHERE id < %(before)s
      AND (CAST(%(kind)s AS text) IS NULL OR kind = %(kind)s)
      AND (CAST(%(outcome)s AS text) IS NULL OR outcome = %(outcome)s)
      AND (CAST(%(receiver)s AS text) IS NULL OR receiver = %(receiver)s)
      AND (CAST(%(since)s AS timestamptz) IS NULL OR started_at >= %(since)s)
      AND (CAST(%(until)s AS timestamptz) IS NULL OR started_at < %(until)s)
    ORDER BY id DESC LIMIT %(limit)s
    """

# Among the latest ``window`` calls only, so a log of successes is not read to its start.
_RECENT_FAILURES = """
    SELECT kind, state_machine, label, state, url, receiver, attempt, trigger, started_at,
           duration_ms, status, outcome, error, response_excerpt, id
    FROM deliveries
    WHERE outcome NOT IN ('delivered', 'accepted')
      AND id > (SELECT COALESCE(max(id), 0) FROM deliveries) - %(window)s
    ORDER BY id DESC LIMIT %(limit)s
    """

_PRUNE = """
    DELETE FROM deliveries WHERE id IN (
        SELECT id FROM (
            SELECT id, started_at FROM deliveries ORDER BY id LIMIT %(batch)s
        ) AS oldest
        WHERE started_at < %(cutoff)s
    )
    """

_NEWEST = 2**63 - 1


def record(conn: sa.Connection, deliveries: Sequence[Delivery]) -> None:
    """Append ``deliveries`` to the log, in one statement."""
    if deliveries:
        params = {name: [getattr(entry, name) for entry in deliveries] for name in _FIELDS}
        params["shard_key"] = [shard_key(entry.label or entry.receiver) for entry in deliveries]
        run(conn, _INSERT, params)


def of_label(
    conn: sa.Connection, state_machine: str, name: str, *, limit: int, before: int | None = None
) -> list[Delivery]:
    """The label's deliveries, newest first, below id ``before``."""
    params = {
        "sm": state_machine,
        "key": label_key(name),
        "shard_key": shard_key(name),
        "name": name,
        "before": _NEWEST if before is None else before,
        "limit": limit,
    }
    return [Delivery(*row) for row in fetch_all(conn, _OF_LABEL, params)]


def matching(
    conn: sa.Connection, where: DeliveryFilter, *, limit: int, before: int | None = None
) -> list[Delivery]:
    """Deliveries that pass ``where``, newest first, below id ``before``."""
    params = {
        "kind": where.kind,
        "outcome": where.outcome,
        "receiver": where.receiver,
        "since": where.since,
        "until": where.until,
        "before": _NEWEST if before is None else before,
        "limit": limit,
    }
    return [Delivery(*row) for row in fetch_all(conn, _MATCHING, params)]


def recent_failures(conn: sa.Connection, *, limit: int, window: int = 10_000) -> list[Delivery]:
    """The latest calls that were not answered with success, among the last ``window``."""
    rows = fetch_all(conn, _RECENT_FAILURES, {"limit": limit, "window": window})
    return [Delivery(*row) for row in rows]


def prune(conn: sa.Connection, *, cutoff: datetime.datetime, batch: int) -> int:
    """Delete up to ``batch`` of the oldest deliveries started before ``cutoff``: how many."""
    return run(conn, _PRUNE, {"cutoff": cutoff, "batch": batch})
