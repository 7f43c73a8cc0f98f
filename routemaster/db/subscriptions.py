"""Push subscriptions: their rows, the lease a worker sends under, and the lag behind the stream.

The worker's side (claims, batches, acknowledgements) is
:mod:`routemaster.db.subscription_batches`.

A subscription follows the changes stream (:mod:`routemaster.db.changes`)
with its own cursor, a stream position. At most one batch is in flight: the
row holds its ``webhook-id`` (``batch_id``), the position of its last event
and its exact body, so every re-send is the same request, and an
acknowledgement moves the cursor only while that batch is still the one in
flight (a cursor reset or a deletion supersedes it).

Workers hold a subscription by a lease (``lease_token``, ``lease_until``),
taken and honoured as :mod:`routemaster.db.subscription_batches` says.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.changes import Position, horizon_position, present
from routemaster.db.horizon import Horizon
from routemaster.db.statements import Row, fetch_all, fetch_one, run

# Reads return a subscription's columns in this order (:func:`subscription_from_row`):
# name, url, state_machines, max_events, batch_delay_ms, signing_secret_env, cursor_xact,
# cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events, due_at, lease_token,
# lease_until, failures_in_a_row, last_attempt_at, last_success_at, last_error,
# created_at, updated_at, lost_events.


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
    lost_events: int = 0  # changes retention removed or skipped before they were sent


@dataclass(frozen=True)
class SubscriptionSettings:
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


def subscription_from_row(row: Row) -> Subscription:
    """A subscription from its columns in the order the statements here return them."""
    (
        name,
        url,
        state_machines,
        max_events,
        batch_delay_ms,
        signing_secret_env,
        cursor_xact,
        cursor_id,
        batch_id,
        batch_last_xact,
        batch_last_id,
        batch_events,
        due_at,
        lease_token,
        lease_until,
        failures_in_a_row,
        last_attempt_at,
        last_success_at,
        last_error,
        created_at,
        updated_at,
        lost_events,
    ) = row
    return Subscription(
        name=name,
        url=url,
        state_machines=tuple(state_machines) if state_machines is not None else None,
        max_events=max_events,
        batch_delay_ms=batch_delay_ms,
        signing_secret_env=signing_secret_env,
        acknowledged=Position(cursor_xact, cursor_id),
        batch_id=batch_id,
        batch_last=Position(batch_last_xact, batch_last_id)
        if batch_last_xact is not None
        else None,
        batch_events=batch_events,
        due_at=due_at,
        lease_token=lease_token,
        lease_until=lease_until,
        failures_in_a_row=failures_in_a_row,
        last_attempt_at=last_attempt_at,
        last_success_at=last_success_at,
        last_error=last_error,
        created_at=created_at,
        updated_at=updated_at,
        lost_events=lost_events,
    )


def _settings(settings: SubscriptionSettings) -> dict[str, Any]:
    return {
        "url": settings.url,
        "sms": list(settings.state_machines) if settings.state_machines is not None else None,
        "max_events": settings.max_events,
        "delay": settings.batch_delay_ms,
        "secret_env": settings.signing_secret_env,
    }


# ---------------------------------------------------------------------------- the API's side

_UPSERT = """
    INSERT INTO subscriptions (name, url, state_machines, max_events, batch_delay_ms,
                               signing_secret_env, cursor_xact, cursor_id)
    VALUES (%(name)s, %(url)s, CAST(%(sms)s AS text[]), %(max_events)s, %(delay)s,
            %(secret_env)s, %(cursor_xact)s, %(cursor_id)s)
    ON CONFLICT (name) DO UPDATE
    SET url = excluded.url, state_machines = excluded.state_machines,
        max_events = excluded.max_events, batch_delay_ms = excluded.batch_delay_ms,
        signing_secret_env = excluded.signing_secret_env, due_at = now(), updated_at = now()
    RETURNING name, url, state_machines, max_events, batch_delay_ms, signing_secret_env,
           cursor_xact, cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events,
           due_at, lease_token, lease_until, failures_in_a_row, last_attempt_at,
           last_success_at, last_error, created_at, updated_at, lost_events,
              (xmax = 0) AS created
    """

_ONE = """
    SELECT name, url, state_machines, max_events, batch_delay_ms, signing_secret_env,
           cursor_xact, cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events,
           due_at, lease_token, lease_until, failures_in_a_row, last_attempt_at,
           last_success_at, last_error, created_at, updated_at, lost_events
    FROM subscriptions WHERE name = %(name)s
    """

_ALL = """
    SELECT name, url, state_machines, max_events, batch_delay_ms, signing_secret_env,
           cursor_xact, cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events,
           due_at, lease_token, lease_until, failures_in_a_row, last_attempt_at,
           last_success_at, last_error, created_at, updated_at, lost_events
    FROM subscriptions ORDER BY name
    """

_DELETE = "DELETE FROM subscriptions WHERE name = %(name)s"

_SET_CURSOR = """
    UPDATE subscriptions
    SET cursor_xact = %(cursor_xact)s, cursor_id = %(cursor_id)s,
        batch_id = NULL, batch_last_xact = NULL, batch_last_id = NULL, batch_events = NULL,
        batch_body = NULL, failures_in_a_row = 0, last_error = NULL, due_at = now(),
        updated_at = now()
    WHERE name = %(name)s
    RETURNING name, url, state_machines, max_events, batch_delay_ms, signing_secret_env,
           cursor_xact, cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events,
           due_at, lease_token, lease_until, failures_in_a_row, last_attempt_at,
           last_success_at, last_error, created_at, updated_at, lost_events
    """

_LAG = """
    SELECT count(*) AS pending, min(created) AS oldest
    FROM history
    WHERE (xact_id, id) > (CAST(%(cursor_xact)s AS xid8), %(cursor_id)s)
      AND xact_id < CAST(%(horizon)s AS xid8)
      AND (CAST(%(sms)s AS text[]) IS NULL OR state_machine = ANY (CAST(%(sms)s AS text[])))
    """


def put_subscription(
    conn: sa.Connection,
    name: str,
    settings: SubscriptionSettings,
    *,
    after: Position | None,
) -> tuple[Subscription, bool]:
    """Create (after ``after``, else the present) or replace, keeping its cursor; if created."""
    start = after if after is not None else present(conn)
    params = {"name": name, **_settings(settings), "cursor_xact": start.xact, "cursor_id": start.id}
    row = fetch_one(conn, _UPSERT, params)
    assert row is not None  # an upsert returns its row
    return subscription_from_row(row[:-1]), bool(row[-1])


def get_subscription(conn: sa.Connection, name: str) -> Subscription | None:
    row = fetch_one(conn, _ONE, {"name": name})
    return None if row is None else subscription_from_row(row)


def all_subscriptions(conn: sa.Connection) -> list[Subscription]:
    return [subscription_from_row(row) for row in fetch_all(conn, _ALL)]


def delete_subscription(conn: sa.Connection, name: str) -> bool:
    return run(conn, _DELETE, {"name": name}) > 0


def set_cursor(conn: sa.Connection, name: str, after: Position) -> Subscription | None:
    """Replay from ``after``: the batch in flight, if any, is superseded."""
    params = {"name": name, "cursor_xact": after.xact, "cursor_id": after.id}
    row = fetch_one(conn, _SET_CURSOR, params)
    return None if row is None else subscription_from_row(row)


def lag(conn: sa.Connection, subscription: Subscription, horizon: Horizon) -> Lag:
    """How far behind the stream: the changes after the cursor it takes, and the oldest's time.

    Counted over the history index from the cursor, so it costs in
    proportion to the lag.
    """
    below = horizon_position(conn, horizon)
    sms = subscription.state_machines
    pending, oldest = fetch_all(
        conn,
        _LAG,
        {
            "cursor_xact": str(subscription.acknowledged.xact),
            "cursor_id": subscription.acknowledged.id,
            "horizon": str(below.xact),
            "sms": list(sms) if sms is not None else None,
        },
    )[0]
    return Lag(int(pending), oldest)
