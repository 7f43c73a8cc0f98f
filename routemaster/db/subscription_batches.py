"""Push subscriptions, the worker's side: the lease a batch is sent under, its acknowledgement.

Workers claim rows with ``FOR UPDATE SKIP LOCKED`` and hold them by a lease
(``lease_token``, ``lease_until``); every write after a send names the batch
or the lease it is about, so a worker whose lease ran out changes nothing
that another worker now holds. The rows themselves and the API's statements
are :mod:`routemaster.db.subscriptions`.

These claims are of subscriptions, not labels, so they are not with the
claims of labels (:mod:`routemaster.db.label_claims`): a few rows in a table
that stays on the coordinator on Citus (no shard key, no shard-by-shard
take), with a lease of their own (a token and an end, not a label's
``lease_owner`` and ``due_at``), and no claimable index to agree with.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.changes import Position
from routemaster.db.horizon import Horizon
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import fetch_all, fetch_one, run
from routemaster.db.subscriptions import Subscription, subscription_from_row

# Claims return a subscription's columns in the order subscription_from_row reads them.
_LOOK = """
    SELECT EXISTS (SELECT 1 FROM subscriptions) AS subscribed,
           (SELECT max(id) FROM history) AS last_change,
           (SELECT count(*) FROM history
            WHERE xact_id >= pg_snapshot_xmin(pg_current_snapshot())) AS in_doubt,
           (SELECT min(due_at) FROM subscriptions
            WHERE lease_until IS NULL OR lease_until <= %(now)s) AS next_due
    """

# On Citus: the subscriptions alone; what the stream has is the confirmed horizon.
_LOOK_SUBSCRIPTIONS = """
    SELECT EXISTS (SELECT 1 FROM subscriptions) AS subscribed,
           (SELECT min(due_at) FROM subscriptions
            WHERE lease_until IS NULL OR lease_until <= %(now)s) AS next_due
    """

_CLAIM = """
    UPDATE subscriptions SET lease_token = %(token)s, lease_until = %(lease_until)s
    WHERE name IN (
        SELECT name FROM subscriptions
        WHERE (lease_until IS NULL OR lease_until <= %(now)s)
          AND (due_at <= %(now)s OR (%(news)s AND batch_id IS NULL))
        ORDER BY due_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING name, url, state_machines, max_events, batch_delay_ms, signing_secret_env,
              cursor_xact, cursor_id, batch_id, batch_last_xact, batch_last_id, batch_events,
              due_at, lease_token, lease_until, failures_in_a_row, last_attempt_at,
              last_success_at, last_error, created_at, updated_at, lost_events
    """

_BATCH_BODY = """
    SELECT batch_body FROM subscriptions WHERE name = %(name)s AND batch_id = %(batch_id)s
    """

_CUT = """
    UPDATE subscriptions
    SET batch_id = %(batch_id)s, batch_last_xact = %(last_xact)s, batch_last_id = %(last_id)s,
        batch_events = %(events)s, batch_body = %(body)s, lease_until = %(lease_until)s
    WHERE name = %(name)s AND lease_token = %(token)s AND batch_id IS NULL
      AND cursor_xact = %(cursor_xact)s AND cursor_id = %(cursor_id)s
    """

_SKIP = """
    UPDATE subscriptions SET cursor_xact = %(to_xact)s, cursor_id = %(to_id)s
    WHERE name = %(name)s AND lease_token = %(token)s AND batch_id IS NULL
      AND cursor_xact = %(cursor_xact)s AND cursor_id = %(cursor_id)s
    """

# The kept changes between the cursor and the gap, of the machines it follows, are skipped
# and counted (the removed ones were counted when they were removed: db/retention.py).
_FALL_BEHIND = """
    UPDATE subscriptions
    SET cursor_xact = %(to_xact)s, cursor_id = %(to_id)s, updated_at = now(),
        lost_events = lost_events + (
            SELECT count(*) FROM history
            WHERE (xact_id, id) > (CAST(%(from_xid)s AS xid8), %(cursor_id)s)
              AND (xact_id, id) <= (CAST(%(to_xid)s AS xid8), %(to_id)s)
              AND (state_machines IS NULL OR history.state_machine = ANY (state_machines)))
    WHERE name = %(name)s AND lease_token = %(token)s AND batch_id IS NULL
      AND cursor_xact = %(cursor_xact)s AND cursor_id = %(cursor_id)s
    RETURNING lost_events
    """

# On Citus a subquery of a distributed table may not refer to the row being updated: the
# machines the subscription follows are a parameter instead (as the claim read them).
_FALL_BEHIND_DISTRIBUTED = """
    UPDATE subscriptions
    SET cursor_xact = %(to_xact)s, cursor_id = %(to_id)s, updated_at = now(),
        lost_events = lost_events + (
            SELECT count(*) FROM history
            WHERE (xact_id, id) > (CAST(%(from_xid)s AS xid8), %(cursor_id)s)
              AND (xact_id, id) <= (CAST(%(to_xid)s AS xid8), %(to_id)s)
              AND (CAST(%(sms)s AS text[]) IS NULL
                   OR history.state_machine = ANY (CAST(%(sms)s AS text[]))))
    WHERE name = %(name)s AND lease_token = %(token)s AND batch_id IS NULL
      AND cursor_xact = %(cursor_xact)s AND cursor_id = %(cursor_id)s
    RETURNING lost_events
    """

_ACKNOWLEDGE = """
    UPDATE subscriptions
    SET cursor_xact = batch_last_xact, cursor_id = batch_last_id,
        batch_id = NULL, batch_last_xact = NULL, batch_last_id = NULL, batch_events = NULL,
        batch_body = NULL, failures_in_a_row = 0, last_error = NULL,
        last_attempt_at = %(at)s, last_success_at = %(at)s, due_at = %(at)s
    WHERE name = %(name)s AND batch_id = %(batch_id)s
    """

_FAILED = """
    UPDATE subscriptions
    SET failures_in_a_row = failures_in_a_row + 1, last_error = %(error)s,
        last_attempt_at = %(at)s, due_at = %(retry_at)s
    WHERE name = %(name)s AND batch_id = %(batch_id)s
    """

_WAIT = """
    UPDATE subscriptions
    SET due_at = %(due_at)s, lease_token = NULL, lease_until = NULL,
        last_error = CASE WHEN batch_id IS NULL THEN CAST(%(error)s AS text)
                          ELSE coalesce(CAST(%(error)s AS text), last_error) END
    WHERE name = %(name)s AND lease_token = %(token)s
    """

_RELEASE = """
    UPDATE subscriptions SET lease_token = NULL, lease_until = NULL
    WHERE name = %(name)s AND lease_token = %(token)s
    """

# A stopping worker's claims, not sent: due at once, so another worker takes them now.
_GIVE_BACK = """
    UPDATE subscriptions SET lease_token = NULL, lease_until = NULL,
                             due_at = LEAST(due_at, %(now)s)
    WHERE name = ANY(CAST(%(names)s AS text[])) AND lease_token = %(token)s
    """


@dataclass(frozen=True)
class Look:
    """What a sender's cheap poll sees: whether the stream grew, the soonest due subscription.

    ``stream`` is the newest history id and the number of changes that may
    not be readable yet (written by transactions at or after the oldest one
    still running): when either differs from the last look, a subscription
    may have new events. On Citus it is the confirmed horizon
    (:mod:`routemaster.db.horizon`), which moves whenever changes may have
    become readable, so the look never reads the workers. A hint only: every
    subscription is also looked at again a second after it found nothing.
    """

    subscribed: bool  # whether there is any subscription at all
    stream: tuple[int | None, int]
    next_due: datetime.datetime | None


def look(conn: sa.Connection, *, now: datetime.datetime, horizon: Horizon) -> Look:
    if horizon.distributed(conn):
        found = fetch_one(conn, _LOOK_SUBSCRIPTIONS, {"now": now})
        assert found is not None  # one row of aggregates
        return Look(found[0], (None, horizon.confirmed(conn)), found[1])
    row = fetch_one(conn, _LOOK, {"now": now})
    assert row is not None  # one row of aggregates
    subscribed, last_change, in_doubt, next_due = row
    return Look(subscribed, (last_change, int(in_doubt)), next_due)


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
    params = {"token": token, "now": now, "lease_until": lease_until, "news": news, "limit": limit}
    return [subscription_from_row(row) for row in fetch_all(conn, _CLAIM, params)]


def batch_body(conn: sa.Connection, name: str, batch_id: str) -> bytes | None:
    """The stored body of the batch in flight, while it is still that batch."""
    row = fetch_one(conn, _BATCH_BODY, {"name": name, "batch_id": batch_id})
    return None if row is None or row[0] is None else bytes(row[0])


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
    params = {
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
    }
    return run(conn, _CUT, params) == 1


def skip_to(conn: sa.Connection, subscription: Subscription, reached: Position) -> None:
    """Move an idle cursor over changes the subscription does not take."""
    run(
        conn,
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


def fall_behind(conn: sa.Connection, subscription: Subscription, gap: Position) -> int:
    """Move an idle cursor that retention overtook to ``gap``; its lost events now (0: moved
    meanwhile by someone else)."""
    sms = subscription.state_machines
    row = fetch_one(
        conn,
        _FALL_BEHIND_DISTRIBUTED if distributed(conn) else _FALL_BEHIND,
        {
            "sms": list(sms) if sms is not None else None,
            "name": subscription.name,
            "token": subscription.lease_token,
            "to_xact": gap.xact,
            "to_id": gap.id,
            "to_xid": str(gap.xact),
            "from_xid": str(subscription.acknowledged.xact),
            "cursor_xact": subscription.acknowledged.xact,
            "cursor_id": subscription.acknowledged.id,
        },
    )
    return 0 if row is None else int(row[0])


def acknowledge(conn: sa.Connection, name: str, batch_id: str, *, at: datetime.datetime) -> bool:
    """A 2xx: the cursor moves to the batch's last event, if it is still the batch in flight."""
    return run(conn, _ACKNOWLEDGE, {"name": name, "batch_id": batch_id, "at": at}) == 1


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
    params = {"name": name, "batch_id": batch_id, "error": error, "at": at, "retry_at": retry_at}
    return run(conn, _FAILED, params) == 1


def wait_until(conn: sa.Connection, name: str, token: str, *, due_at: datetime.datetime) -> None:
    """Release a lease with nothing to send before ``due_at`` (unless the stream grows)."""
    run(conn, _WAIT, {"name": name, "token": token, "due_at": due_at, "error": None})


def wait_with_error(
    conn: sa.Connection, name: str, token: str, *, due_at: datetime.datetime, error: str
) -> None:
    """Release a lease that could not send (a missing secret): shown, looked at again later."""
    run(conn, _WAIT, {"name": name, "token": token, "due_at": due_at, "error": error})


def release(conn: sa.Connection, name: str, token: str) -> None:
    """End this claim's lease (after its outcome was recorded)."""
    run(conn, _RELEASE, {"name": name, "token": token})


def give_back(
    conn: sa.Connection, names: Sequence[str], token: str, *, now: datetime.datetime
) -> None:
    """End the claim ``token`` of ``names`` without sending (the worker stops): due at once."""
    if names:
        run(conn, _GIVE_BACK, {"names": list(names), "token": token, "now": now})
