"""Receivers: the state every worker shares about each origin.

One row per receiver: paused or not, its circuit (``closed``, ``open``,
``half_open`` while one probe is out), consecutive failures, and when the
next call may go: ``open_until`` (the circuit's cooldown, or a probe's
lease), ``not_before`` (``Retry-After``), ``rate_at`` (the rate limiter's
theoretical arrival time, advanced by one interval per call). Workers
decide from these rows which receivers' due labels they may claim and how
many (the claim itself: :mod:`routemaster.db.label_claims`); a label
whose receiver may not be called is never claimed, so it waits without
using an attempt.

``receiver_slots`` holds how many calls each worker has in flight to a
receiver with ``max_in_flight``; a row whose worker stopped renewing it
(``expires_at`` passed) counts for nothing.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.notifications import notify_due
from routemaster.db.statements import fetch_all, fetch_one, run

Route = tuple[str, str, str]
"""(receiver id, state machine, action state): where an action's webhooks go."""


@dataclass(frozen=True)
class ReceiverRow:
    id: str
    origin: str
    paused: bool
    circuit: str  # closed, open, half_open
    failures_in_a_row: int
    open_until: datetime.datetime | None
    opened_at: datetime.datetime | None
    not_before: datetime.datetime | None
    rate_at: datetime.datetime | None
    last_success_at: datetime.datetime | None
    last_failure_at: datetime.datetime | None
    last_error: str | None

    @property
    def state(self) -> str:
        """What ``GET /receivers`` shows: ``paused``, or the circuit."""
        return "paused" if self.paused else self.circuit


@dataclass(frozen=True)
class Failure:
    """A call that failed, as it counts against its receiver."""

    receiver: str
    at: datetime.datetime
    error: str
    counted: bool  # timeout, network, 5xx, 429: counts towards opening the circuit
    probe: bool
    threshold: int  # consecutive counted failures that open the circuit
    reopen_at: datetime.datetime  # when an opened circuit lets a probe through
    retry_until: datetime.datetime | None  # Retry-After


# Reads return a receiver's columns in the order of :class:`ReceiverRow`'s fields.

_ENSURE = """
    INSERT INTO receivers (id, origin)
    SELECT * FROM unnest(CAST(%(ids)s AS text[]), CAST(%(origins)s AS text[]))
    ON CONFLICT (id) DO NOTHING
    """

_ALL = """
    SELECT id, origin, paused, circuit, failures_in_a_row, open_until, opened_at, not_before,
           rate_at, last_success_at, last_failure_at, last_error
    FROM receivers ORDER BY id
    """

_SOME = """
    SELECT id, origin, paused, circuit, failures_in_a_row, open_until, opened_at, not_before,
           rate_at, last_success_at, last_failure_at, last_error
    FROM receivers WHERE id = ANY(CAST(%(ids)s AS text[])) ORDER BY id
    """

_LOCK = """
    SELECT id, origin, paused, circuit, failures_in_a_row, open_until, opened_at, not_before,
           rate_at, last_success_at, last_failure_at, last_error
    FROM receivers WHERE id = ANY(CAST(%(ids)s AS text[])) ORDER BY id FOR UPDATE
    """

_START_PROBE = """
    UPDATE receivers SET circuit = 'half_open', open_until = %(probe_until)s
    WHERE id = %(id)s AND NOT paused AND circuit IN ('open', 'half_open')
      AND open_until <= %(now)s
      AND (not_before IS NULL OR not_before <= %(now)s)
    RETURNING id
    """

_NO_PROBE = """
    UPDATE receivers SET circuit = 'open', open_until = %(now)s
    WHERE id = %(id)s AND circuit = 'half_open'
    """

_SET_RATE_AT = """
    UPDATE receivers SET rate_at = given.rate_at
    FROM unnest(CAST(%(ids)s AS text[]), CAST(%(rate_ats)s AS timestamptz[]))
         AS given(id, rate_at)
    WHERE receivers.id = given.id
    """

_MY_SLOTS = """
    INSERT INTO receiver_slots (receiver, worker, in_flight, expires_at)
    SELECT receiver, %(me)s, in_flight, %(expires_at)s
    FROM unnest(CAST(%(ids)s AS text[]), CAST(%(counts)s AS integer[]))
         AS mine(receiver, in_flight)
    ON CONFLICT (receiver, worker)
    DO UPDATE SET in_flight = excluded.in_flight, expires_at = excluded.expires_at
    """

_OTHERS_IN_FLIGHT = """
    SELECT receiver, sum(in_flight) AS in_flight FROM receiver_slots
    WHERE receiver = ANY(CAST(%(ids)s AS text[])) AND worker <> %(me)s AND expires_at > %(now)s
    GROUP BY receiver
    """

_SUCCEEDED = """
    UPDATE receivers SET failures_in_a_row = 0, circuit = 'closed', open_until = NULL,
                         opened_at = NULL, last_success_at = %(now)s
    WHERE id = ANY(CAST(%(ids)s AS text[]))
      AND (failures_in_a_row > 0 OR circuit <> 'closed' OR last_success_at IS NULL
           OR last_success_at < %(stale)s)
    """

# A probe's failure opens the circuit again; otherwise the counted failure that reaches
# the threshold opens a closed one (SET expressions see the row as it was, locked). The
# same test is written out for each column it decides.
_FAILED = """
    UPDATE receivers SET
        failures_in_a_row = failures_in_a_row + %(counted)s,
        last_failure_at = %(now)s, last_error = %(error)s,
        not_before = GREATEST(not_before, CAST(%(retry_until)s AS timestamptz)),
        circuit = CASE WHEN (%(probe)s OR (%(counted)s = 1 AND circuit = 'closed'
                                           AND failures_in_a_row + 1 >= %(threshold)s))
                       THEN 'open' ELSE circuit END,
        open_until = CASE WHEN (%(probe)s OR (%(counted)s = 1 AND circuit = 'closed'
                                              AND failures_in_a_row + 1 >= %(threshold)s))
                          THEN GREATEST(CAST(%(reopen_at)s AS timestamptz),
                                        CAST(%(retry_until)s AS timestamptz))
                          ELSE open_until END,
        opened_at = CASE WHEN (%(probe)s OR (%(counted)s = 1 AND circuit = 'closed'
                                             AND failures_in_a_row + 1 >= %(threshold)s))
                              AND circuit = 'closed' THEN %(now)s ELSE opened_at END
    WHERE id = %(id)s
    RETURNING circuit
    """

_SET_PAUSED = """
    UPDATE receivers SET paused = %(paused)s WHERE id = %(id)s
    RETURNING id, origin, paused, circuit, failures_in_a_row, open_until, opened_at, not_before,
           rate_at, last_success_at, last_failure_at, last_error
    """


def ensure(conn: sa.Connection, receivers: Sequence[tuple[str, str]]) -> None:
    """Make sure every (id, origin) has a row (a new receiver starts closed)."""
    if receivers:
        params = {"ids": [ident for ident, _ in receivers], "origins": [o for _, o in receivers]}
        run(conn, _ENSURE, params)


def all_receivers(conn: sa.Connection) -> list[ReceiverRow]:
    return [ReceiverRow(*row) for row in fetch_all(conn, _ALL)]


def some(conn: sa.Connection, ids: Sequence[str], *, lock: bool = False) -> list[ReceiverRow]:
    """The rows of ``ids`` (locked for this transaction when ``lock``)."""
    if not ids:
        return []
    rows = fetch_all(conn, _LOCK if lock else _SOME, {"ids": list(ids)})
    return [ReceiverRow(*row) for row in rows]


def start_probe(
    conn: sa.Connection, ident: str, *, now: datetime.datetime, probe_until: datetime.datetime
) -> bool:
    """Take the one probe of an open receiver whose cooldown is over; whether this caller got it."""
    params = {"id": ident, "now": now, "probe_until": probe_until}
    return run(conn, _START_PROBE, params) == 1


def no_probe(conn: sa.Connection, ident: str, *, now: datetime.datetime) -> None:
    """Nothing was waiting to probe with: open again, ready for the next probe."""
    run(conn, _NO_PROBE, {"id": ident, "now": now})


def set_rate_at(conn: sa.Connection, rate_ats: dict[str, datetime.datetime]) -> None:
    if rate_ats:
        run(conn, _SET_RATE_AT, {"ids": list(rate_ats), "rate_ats": list(rate_ats.values())})


def others_in_flight(
    conn: sa.Connection,
    mine: dict[str, int],
    *,
    worker_id: str,
    now: datetime.datetime,
    expires_at: datetime.datetime,
) -> dict[str, int]:
    """Record this worker's calls in flight per receiver; those of the other live workers."""
    if not mine:
        return {}
    run(
        conn,
        _MY_SLOTS,
        {
            "ids": list(mine),
            "counts": list(mine.values()),
            "me": worker_id,
            "expires_at": expires_at,
        },
    )
    rows = fetch_all(conn, _OTHERS_IN_FLIGHT, {"ids": list(mine), "me": worker_id, "now": now})
    return {receiver: int(in_flight) for receiver, in_flight in rows}


def succeeded(conn: sa.Connection, ids: Sequence[str], *, now: datetime.datetime) -> None:
    """Calls to ``ids`` were answered: their circuits close (written at most once a second)."""
    if ids:
        stale = now - datetime.timedelta(seconds=1)
        run(conn, _SUCCEEDED, {"ids": list(ids), "now": now, "stale": stale})


def failed(conn: sa.Connection, failure: Failure) -> str | None:
    """Count a failed call against its receiver; the circuit after it."""
    row = fetch_one(
        conn,
        _FAILED,
        {
            "id": failure.receiver,
            "counted": int(failure.counted),
            "probe": failure.probe,
            "threshold": failure.threshold,
            "now": failure.at,
            "error": failure.error,
            "retry_until": failure.retry_until,
            "reopen_at": failure.reopen_at,
        },
    )
    return None if row is None else str(row[0])


def set_receiver_paused(conn: sa.Connection, ident: str, *, paused: bool) -> ReceiverRow | None:
    row = fetch_one(conn, _SET_PAUSED, {"id": ident, "paused": paused})
    if row is None:
        return None
    if not paused:
        notify_due(conn)
    return ReceiverRow(*row)


def route_arrays(routes: Sequence[Route]) -> dict[str, Any]:
    """The parameters that hand ``routes`` to a statement as three parallel arrays."""
    return {
        "route_receivers": [route[0] for route in routes],
        "route_machines": [route[1] for route in routes],
        "route_states": [route[2] for route in routes],
    }


def forget_expired_slots(conn: sa.Connection, *, before: datetime.datetime, limit: int) -> int:
    """Delete slots that expired before ``before``: each worker process adds its own rows."""
    return run(conn, _FORGET_SLOTS, {"before": before, "limit": limit})


_FORGET_SLOTS = """
    DELETE FROM receiver_slots WHERE (receiver, worker) IN (
        SELECT receiver, worker FROM receiver_slots WHERE expires_at < %(before)s
        LIMIT %(limit)s)
    """
