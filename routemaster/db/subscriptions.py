"""Push subscriptions: their rows, the lease a worker sends under, and the lag behind the stream.

A subscription follows the changes stream (:mod:`routemaster.db.changes`)
with its own cursor, a stream position. At most one batch is in flight: the
row holds its ``webhook-id`` (``batch_id``), the position of its last event
and its exact body, so every re-send is the same request, and an
acknowledgement moves the cursor only while that batch is still the one in
flight (a cursor reset or a deletion supersedes it).

Workers claim rows with ``FOR UPDATE SKIP LOCKED`` and hold them by a lease
(``lease_token``, ``lease_until``); every write after a send names the batch
or the lease it is about, so a worker whose lease ran out changes nothing
that another worker now holds.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.changes import Position, current_position

_COLUMNS = """
    name, url, state_machines, max_events, batch_delay_ms, signing_secret_env,
    cursor_xact, cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events,
    due_at, lease_token, lease_until, failures_in_a_row, last_attempt_at, last_success_at,
    last_error, created_at, updated_at
"""


@dataclass(frozen=True)
class Subscription:
    """A stored subscription (without its batch's body)."""

    name: str
    url: str
    state_machines: tuple[str, ...] | None  # None: every machine
    max_events: int
    batch_delay_ms: int
    signing_secret_env: str | None
    acknowledged: Position  # the cursor: every change up to here was acknowledged
    batch_id: str | None
    batch_last: Position | None
    batch_events: int | None
    due_at: datetime.datetime
    lease_token: str | None
    lease_until: datetime.datetime | None
    failures_in_a_row: int
    last_attempt_at: datetime.datetime | None
    last_success_at: datetime.datetime | None
    last_error: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime


@dataclass(frozen=True)
class Settings:
    """What a ``PUT`` sets (every field but the cursor, which it only sets when creating)."""

    url: str
    state_machines: tuple[str, ...] | None
    max_events: int
    batch_delay_ms: int
    signing_secret_env: str | None


@dataclass(frozen=True)
class Lag:
    pending: int  # changes after the cursor that the subscription takes
    oldest_pending_at: datetime.datetime | None


def _subscription(row: sa.Row[Any]) -> Subscription:
    last = (
        Position(row.batch_last_xact, row.batch_last_id)
        if row.batch_last_xact is not None
        else None
    )
    return Subscription(
        name=row.name,
        url=row.url,
        state_machines=tuple(row.state_machines) if row.state_machines is not None else None,
        max_events=row.max_events,
        batch_delay_ms=row.batch_delay_ms,
        signing_secret_env=row.signing_secret_env,
        acknowledged=Position(row.cursor_xact, row.cursor_id),
        batch_id=row.batch_id,
        batch_last=last,
        batch_events=row.batch_events,
        due_at=row.due_at,
        lease_token=row.lease_token,
        lease_until=row.lease_until,
        failures_in_a_row=row.failures_in_a_row,
        last_attempt_at=row.last_attempt_at,
        last_success_at=row.last_success_at,
        last_error=row.last_error,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _settings(settings: Settings) -> dict[str, Any]:
    return {
        "url": settings.url,
        "sms": list(settings.state_machines) if settings.state_machines is not None else None,
        "max_events": settings.max_events,
        "delay": settings.batch_delay_ms,
        "secret_env": settings.signing_secret_env,
    }


# ---------------------------------------------------------------------------- the API's side

_UPSERT = sa.text(
    f"""
    INSERT INTO subscriptions (name, url, state_machines, max_events, batch_delay_ms,
                               signing_secret_env, cursor_xact, cursor_id)
    VALUES (:name, :url, CAST(:sms AS text[]), :max_events, :delay, :secret_env,
            :cursor_xact, :cursor_id)
    ON CONFLICT (name) DO UPDATE
    SET url = excluded.url, state_machines = excluded.state_machines,
        max_events = excluded.max_events, batch_delay_ms = excluded.batch_delay_ms,
        signing_secret_env = excluded.signing_secret_env, due_at = now(), updated_at = now()
    RETURNING (xmax = 0) AS created, {_COLUMNS}
    """
)

_ONE = sa.text(f"SELECT {_COLUMNS} FROM subscriptions WHERE name = :name")

_ALL = sa.text(f"SELECT {_COLUMNS} FROM subscriptions ORDER BY name")

_DELETE = sa.text("DELETE FROM subscriptions WHERE name = :name")

_SET_CURSOR = sa.text(
    f"""
    UPDATE subscriptions
    SET cursor_xact = :cursor_xact, cursor_id = :cursor_id,
        batch_id = NULL, batch_last_xact = NULL, batch_last_id = NULL, batch_events = NULL,
        batch_body = NULL, failures_in_a_row = 0, last_error = NULL, due_at = now(),
        updated_at = now()
    WHERE name = :name
    RETURNING {_COLUMNS}
    """
)

_LAG = sa.text(
    """
    SELECT count(*) AS pending, min(created) AS oldest
    FROM history
    WHERE (xact_id, id) > (CAST(:cursor_xact AS xid8), :cursor_id)
      AND xact_id < CAST(:horizon AS xid8)
      AND (CAST(:sms AS text[]) IS NULL OR state_machine = ANY (CAST(:sms AS text[])))
    """
)


def put_subscription(
    conn: sa.Connection, name: str, settings: Settings, *, after: Position | None
) -> tuple[Subscription, bool]:
    """Create (at ``after``, else the present) or replace, keeping the cursor; whether created."""
    start = after if after is not None else current_position(conn)
    row = conn.execute(
        _UPSERT,
        {
            "name": name,
            **_settings(settings),
            "cursor_xact": start.xact,
            "cursor_id": start.id,
        },
    ).one()
    return _subscription(row), bool(row.created)


def get_subscription(conn: sa.Connection, name: str) -> Subscription | None:
    row = conn.execute(_ONE, {"name": name}).one_or_none()
    return None if row is None else _subscription(row)


def all_subscriptions(conn: sa.Connection) -> list[Subscription]:
    return [_subscription(row) for row in conn.execute(_ALL)]


def delete_subscription(conn: sa.Connection, name: str) -> bool:
    return conn.execute(_DELETE, {"name": name}).rowcount > 0


def set_cursor(conn: sa.Connection, name: str, after: Position) -> Subscription | None:
    """Replay from ``after``: the batch in flight, if any, is superseded."""
    row = conn.execute(
        _SET_CURSOR, {"name": name, "cursor_xact": after.xact, "cursor_id": after.id}
    ).one_or_none()
    return None if row is None else _subscription(row)


def lag(conn: sa.Connection, subscription: Subscription) -> Lag:
    """How far behind the stream: the changes after the cursor it takes, and the oldest's time.

    Counted over the history index from the cursor, so it costs in
    proportion to the lag.
    """
    horizon = current_position(conn)
    sms = subscription.state_machines
    row = conn.execute(
        _LAG,
        {
            "cursor_xact": str(subscription.acknowledged.xact),
            "cursor_id": subscription.acknowledged.id,
            "horizon": str(horizon.xact),
            "sms": list(sms) if sms is not None else None,
        },
    ).one()
    return Lag(int(row.pending), row.oldest)


# --------------------------------------------------------------------------- the worker's side

_LOOK = sa.text(
    """
    SELECT EXISTS (SELECT 1 FROM subscriptions) AS subscribed,
           (SELECT max(id) FROM history) AS last_change,
           (SELECT count(*) FROM history
            WHERE xact_id >= pg_snapshot_xmin(pg_current_snapshot())) AS in_doubt,
           (SELECT min(due_at) FROM subscriptions
            WHERE lease_until IS NULL OR lease_until <= :now) AS next_due
    """
)

_CLAIM = sa.text(
    f"""
    UPDATE subscriptions SET lease_token = :token, lease_until = :lease_until
    WHERE name IN (
        SELECT name FROM subscriptions
        WHERE (lease_until IS NULL OR lease_until <= :now)
          AND (due_at <= :now OR (:news AND batch_id IS NULL))
        ORDER BY due_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING {_COLUMNS}
    """
)

_BATCH_BODY = sa.text(
    "SELECT batch_body FROM subscriptions WHERE name = :name AND batch_id = :batch_id"
)

_CUT = sa.text(
    """
    UPDATE subscriptions
    SET batch_id = :batch_id, batch_last_xact = :last_xact, batch_last_id = :last_id,
        batch_events = :events, batch_body = :body, lease_until = :lease_until
    WHERE name = :name AND lease_token = :token AND batch_id IS NULL
      AND cursor_xact = :cursor_xact AND cursor_id = :cursor_id
    """
)

_SKIP = sa.text(
    """
    UPDATE subscriptions SET cursor_xact = :to_xact, cursor_id = :to_id
    WHERE name = :name AND lease_token = :token AND batch_id IS NULL
      AND cursor_xact = :cursor_xact AND cursor_id = :cursor_id
    """
)

_ACKNOWLEDGE = sa.text(
    """
    UPDATE subscriptions
    SET cursor_xact = batch_last_xact, cursor_id = batch_last_id,
        batch_id = NULL, batch_last_xact = NULL, batch_last_id = NULL, batch_events = NULL,
        batch_body = NULL, failures_in_a_row = 0, last_error = NULL,
        last_attempt_at = :at, last_success_at = :at, due_at = :at
    WHERE name = :name AND batch_id = :batch_id
    """
)

_FAILED = sa.text(
    """
    UPDATE subscriptions
    SET failures_in_a_row = failures_in_a_row + 1, last_error = :error,
        last_attempt_at = :at, due_at = :retry_at
    WHERE name = :name AND batch_id = :batch_id
    """
)

_WAIT = sa.text(
    """
    UPDATE subscriptions
    SET due_at = :due_at, lease_token = NULL, lease_until = NULL,
        last_error = CASE WHEN batch_id IS NULL THEN CAST(:error AS text)
                          ELSE coalesce(CAST(:error AS text), last_error) END
    WHERE name = :name AND lease_token = :token
    """
)

_RELEASE = sa.text(
    """
    UPDATE subscriptions SET lease_token = NULL, lease_until = NULL
    WHERE name = :name AND lease_token = :token
    """
)


@dataclass(frozen=True)
class Look:
    """What a sender's cheap poll sees: whether the stream grew, the soonest due subscription.

    ``stream`` is the newest history id and the number of changes that may
    not be readable yet (written by transactions at or after the oldest one
    still running): when either differs from the last look, a subscription
    may have new events. A hint only: every subscription is also looked at
    again a second after it found nothing.
    """

    subscribed: bool  # whether there is any subscription at all
    stream: tuple[int | None, int]
    next_due: datetime.datetime | None


def look(conn: sa.Connection, *, now: datetime.datetime) -> Look:
    row = conn.execute(_LOOK, {"now": now}).one()
    return Look(row.subscribed, (row.last_change, int(row.in_doubt)), row.next_due)


def claim_subscriptions(
    conn: sa.Connection,
    *,
    token: str,
    now: datetime.datetime,
    lease_until: datetime.datetime,
    news: bool,
    limit: int,
) -> list[Subscription]:
    """Lease up to ``limit`` subscriptions that are due (or, with ``news``, that may have work).

    ``news``: the stream has grown since this worker last looked, so any
    subscription with no batch in flight (none backing off) may have events.
    """
    if limit <= 0:
        return []
    rows = conn.execute(
        _CLAIM,
        {"token": token, "now": now, "lease_until": lease_until, "news": news, "limit": limit},
    ).all()
    return [_subscription(row) for row in rows]


def batch_body(conn: sa.Connection, name: str, batch_id: str) -> bytes | None:
    """The stored body of the batch in flight, while it is still that batch."""
    body = conn.execute(_BATCH_BODY, {"name": name, "batch_id": batch_id}).scalar_one_or_none()
    return None if body is None else bytes(body)


def cut_batch(
    conn: sa.Connection,
    subscription: Subscription,
    *,
    batch_id: str,
    last: Position,
    events: int,
    body: bytes,
    lease_until: datetime.datetime,
) -> bool:
    """Record the batch about to be sent, renewing the lease for its send.

    ``False`` if the lease or the cursor changed meanwhile (nothing is written).
    """
    return (
        conn.execute(
            _CUT,
            {
                "name": subscription.name,
                "token": subscription.lease_token,
                "batch_id": batch_id,
                "last_xact": last.xact,
                "last_id": last.id,
                "events": events,
                "body": body,
                "lease_until": lease_until,
                "cursor_xact": subscription.acknowledged.xact,
                "cursor_id": subscription.acknowledged.id,
            },
        ).rowcount
        == 1
    )


def skip_to(conn: sa.Connection, subscription: Subscription, reached: Position) -> None:
    """Move an idle cursor over changes the subscription does not take."""
    conn.execute(
        _SKIP,
        {
            "name": subscription.name,
            "token": subscription.lease_token,
            "to_xact": reached.xact,
            "to_id": reached.id,
            "cursor_xact": subscription.acknowledged.xact,
            "cursor_id": subscription.acknowledged.id,
        },
    )


def acknowledge(conn: sa.Connection, name: str, batch_id: str, *, at: datetime.datetime) -> bool:
    """A 2xx: the cursor moves to the batch's last event, if it is still the batch in flight."""
    return conn.execute(_ACKNOWLEDGE, {"name": name, "batch_id": batch_id, "at": at}).rowcount == 1


def record_failure(
    conn: sa.Connection,
    name: str,
    batch_id: str,
    *,
    error: str,
    at: datetime.datetime,
    retry_at: datetime.datetime,
) -> bool:
    """The batch failed: the same batch goes again at ``retry_at``."""
    return (
        conn.execute(
            _FAILED,
            {"name": name, "batch_id": batch_id, "error": error, "at": at, "retry_at": retry_at},
        ).rowcount
        == 1
    )


def wait_until(conn: sa.Connection, name: str, token: str, *, due_at: datetime.datetime) -> None:
    """Release a lease with nothing to send before ``due_at`` (unless the stream grows)."""
    conn.execute(_WAIT, {"name": name, "token": token, "due_at": due_at, "error": None})


def wait_with_error(
    conn: sa.Connection, name: str, token: str, *, due_at: datetime.datetime, error: str
) -> None:
    """Release a lease that could not send (a missing secret): shown, looked at again later."""
    conn.execute(_WAIT, {"name": name, "token": token, "due_at": due_at, "error": error})


def release(conn: sa.Connection, name: str, token: str) -> None:
    """End this claim's lease (after its outcome was recorded)."""
    conn.execute(_RELEASE, {"name": name, "token": token})
