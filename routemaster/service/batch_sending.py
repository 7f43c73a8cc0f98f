"""One claimed push subscription: read what is pending, cut a batch, send it, record the answer.

Runs in the sender's thread pool under the subscription's lease, with no
transaction open during the HTTP call:

1. A batch already in flight (a failed one) is sent again as stored: the same
   ``webhook-id``, the same body.
2. Otherwise the changes after the cursor are read with the stream's
   commit-safe reads (:func:`routemaster.db.changes.read_changes`), so none is
   skipped when transactions commit out of order. With ``max_events`` pending,
   or the oldest pending ``batch_delay_ms`` old, the batch is cut: its id, last
   position and body are stored (only if the cursor is still where it was read
   from), then it is sent. Else the lease is given back with the time the
   oldest event will be due.
3. A 2xx moves the cursor to the batch's last event, in the transaction that
   records the attempt, and only while that batch is still the one in flight
   (a cursor reset or a deletion supersedes it). Anything else keeps the
   batch, and it is due again after the backoff.

The receivers' flow control (delivery log, limits, circuit: SPEC D4) plugs in
at one seam, :class:`ReceiverSeam`: asked before each send, told in the
recording transaction after it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import random
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import requests
import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import RetryPolicy
from routemaster.db import subscription_batches as sending
from routemaster.db.changes import Change, Position, read_changes
from routemaster.db.events import subscription_event
from routemaster.db.subscriptions import Subscription
from routemaster.http.subscription_batches import batch_body, batch_request
from routemaster.http.webhooks import DeliveryResult, Outcome, deliver
from routemaster.machine.retry import backoff
from routemaster.service.transactions import reading, writing

logger = logging.getLogger(__name__)

READ_PAGE = 1_000  # changes per read when filtering several machines
MAX_PAGES = 20  # reads per look: a subscription far behind on other machines' changes catches up
IDLE_RECHECK = datetime.timedelta(seconds=1)  # nothing pending: look again (sooner on news)
SECRET_RECHECK = datetime.timedelta(seconds=5)  # the signing variable is missing
MAX_BATCHES_PER_CLAIM = 50  # full batches sent in a row under one claim before letting go


def look(app: App, now: datetime.datetime) -> sending.Look:
    """One cheap read of the stream and the subscriptions: is there news, what falls due."""
    with reading(app) as conn:
        return sending.look(conn, now=now, horizon=app.horizon)


def claim_subscriptions(
    app: App, *, token: str, now: datetime.datetime, news: bool, limit: int
) -> list[Subscription]:
    """Lease up to ``limit`` subscriptions that may have a batch to send (``news``: the stream
    grew, so any subscription may; else only those whose time came)."""
    lease = datetime.timedelta(seconds=app.settings.subscription_lease)
    with writing(app) as conn:
        return sending.claim_subscriptions(
            conn, token=token, now=now, lease_until=now + lease, news=news, limit=limit
        )


def give_back(app: App, claimed: Sequence[Subscription], token: str) -> None:
    """Claimed but not sent (the worker stops): due at once, for another worker."""
    with writing(app) as conn:
        names = [subscription.name for subscription in claimed]
        sending.give_back(conn, names, token, now=app.now())


class _Stopping(Exception):
    """The worker is stopping: the claimed subscription's batch is not sent."""


@dataclass(frozen=True)
class Hold:
    """The receiver may not be called now: look again at ``until``."""

    until: datetime.datetime
    reason: str


class ReceiverSeam:
    """Where receivers (SPEC D4) take part: asked before each send, told of its outcome.

    :meth:`may_send` answers a :class:`Hold` or a permit (any object, handed
    back to :meth:`record` and :meth:`finished`). This default lets every
    batch go and records nothing; :mod:`routemaster.service.subscription_receivers`
    applies the receivers' limits and circuit and writes the delivery log.
    """

    def may_send(self, app: App, subscription: Subscription) -> Hold | object:
        return self

    def record(
        self,
        conn: sa.Connection,
        subscription: Subscription,
        permit: object,
        result: DeliveryResult,
    ) -> None:
        """Called in the transaction that records the outcome (and moves the cursor on a 2xx)."""

    def finished(self, permit: object) -> None:
        """The send with ``permit`` is over, recorded or not."""


@dataclass(frozen=True)
class Pending:
    """The events a subscription takes after its cursor, and how far the read reached."""

    changes: list[Change]
    reached: Position
    more: bool  # at least ``max_events`` are pending
    gap: Position | None = None  # retention removed changes after the cursor, up to here


class BatchSender:
    """What a sender thread does with one claimed subscription."""

    def __init__(
        self,
        app: App,
        session: requests.Session,
        *,
        rng: random.Random,
        environ: Mapping[str, str],
        seam: ReceiverSeam,
        stopping: threading.Event | None = None,
    ) -> None:
        self.app = app
        self.stopping = stopping or threading.Event()
        self.session = session
        self.rng = rng
        self.environ = environ
        self.seam = seam
        settings = app.settings
        self.lease = datetime.timedelta(seconds=settings.subscription_lease)
        self.policy = RetryPolicy(
            initial_delay=datetime.timedelta(seconds=settings.subscription_backoff),
            max_delay=datetime.timedelta(seconds=settings.subscription_max_backoff),
        )

    def handle(self, subscription: Subscription) -> None:
        """Send what is due under this claim; the lease is always given back.

        Once ``stopping`` is set no batch is sent: the subscription is given back
        due at once, for another worker to send now.
        """
        token = subscription.lease_token
        assert token is not None
        unsent = False
        try:
            for _ in range(MAX_BATCHES_PER_CLAIM):
                if self.stopping.is_set():
                    raise _Stopping
                following = self._once(subscription)
                if following is None:
                    return
                subscription = following
        except _Stopping:
            unsent = True
        finally:
            with writing(self.app) as conn:
                if unsent:
                    sending.give_back(conn, [subscription.name], token, now=self.app.now())
                else:
                    sending.release(conn, subscription.name, token)

    def _once(self, subscription: Subscription) -> Subscription | None:
        """One batch (or none); the subscription as it is after a full batch was acknowledged."""
        secret, missing = self._secret(subscription)
        if missing is not None:
            self._wait(subscription, self.app.now() + SECRET_RECHECK, error=missing)
            return None
        if subscription.batch_id is not None:
            with reading(self.app) as conn:
                body = sending.batch_body(conn, subscription.name, subscription.batch_id)
            if body is None:  # superseded meanwhile (cursor reset, deleted)
                return None
            batch_id, events, last = subscription.batch_id, subscription.batch_events, None
        else:
            cut = self._cut(subscription)
            if cut is None:
                return None
            batch_id, body, events, last = cut
        if self.stopping.is_set():  # stopped while the batch was read: another worker sends it
            raise _Stopping
        permit = self.seam.may_send(self.app, subscription)
        if isinstance(permit, Hold):
            self._wait(subscription, permit.until, error=permit.reason)
            return None
        try:
            delivered = self._send(subscription, permit, batch_id, body, secret, events or 0)
        finally:
            self.seam.finished(permit)
        full = events is not None and events >= subscription.max_events
        if not (delivered and full and last is not None):
            return None
        return dataclasses.replace(
            subscription, acknowledged=last, batch_id=None, batch_last=None, failures_in_a_row=0
        )

    def _secret(self, subscription: Subscription) -> tuple[str | None, str | None]:
        """The signing secret read now (never stored), or why the batch must wait."""
        variable = subscription.signing_secret_env
        if variable is None:
            return None, None
        secret = self.environ.get(variable)
        if not secret:
            return None, (
                f"the signing secret's variable {variable} is not set in the worker's "
                "environment: batches wait (they are never sent unsigned)"
            )
        return secret, None

    def _cut(self, subscription: Subscription) -> tuple[str, bytes, int, Position] | None:
        """Read the pending events; store and return a batch if one is due, else wait."""
        with reading(self.app) as conn:
            pending = self.pending(conn, subscription)
        now = self.app.now()
        if pending.gap is not None:  # behind retention: move on, and count what was skipped
            with writing(self.app) as conn:
                lost = sending.fall_behind(conn, subscription, pending.gap)
                self._wait_in(conn, subscription, now)
            logger.warning(
                "subscription %s was behind retention: moved on to %s (lost events: %d)",
                subscription.name,
                pending.gap,
                lost,
            )
            return None
        if not pending.changes:
            with writing(self.app) as conn:
                if pending.reached > subscription.acknowledged:
                    sending.skip_to(conn, subscription, pending.reached)
                self._wait_in(conn, subscription, now + IDLE_RECHECK)
            return None
        due = pending.changes[0].at + datetime.timedelta(milliseconds=subscription.batch_delay_ms)
        if not pending.more and now < due:
            self._wait(subscription, due)
            return None
        events = [subscription_event(change) for change in pending.changes]
        batch_id = f"msg_{uuid.uuid4().hex}"
        body = batch_body(subscription.name, events)
        last = pending.changes[-1].position
        with writing(self.app) as conn:
            stored = sending.cut_batch(
                conn,
                subscription,
                batch_id=batch_id,
                last=last,
                events=len(events),
                body=body,
                lease_until=now + self.lease,
            )
        return (batch_id, body, len(events), last) if stored else None

    def pending(self, conn: sa.Connection, subscription: Subscription) -> Pending:
        """Up to ``max_events`` changes after the cursor, of the subscription's machines."""
        machines = subscription.state_machines
        single = machines[0] if machines is not None and len(machines) == 1 else None
        exact = machines is None or single is not None
        wanted = subscription.max_events
        taken: list[Change] = []
        reached = subscription.acknowledged
        for _ in range(MAX_PAGES):
            page = read_changes(
                conn,
                reached,
                machine=single,
                limit=wanted if exact else READ_PAGE,
                horizon=self.app.horizon,
            )
            if page.gap is not None and not taken:
                return Pending([], subscription.acknowledged, more=False, gap=page.gap)
            for change in page.changes:
                if machines is None or change.state_machine in machines:
                    taken.append(change)
                    if len(taken) == wanted:
                        return Pending(taken, change.position, more=True)
            reached = page.reached
            if len(page.changes) < (wanted if exact else READ_PAGE):
                break
        return Pending(taken, reached if not taken else taken[-1].position, more=False)

    def _send(
        self,
        subscription: Subscription,
        permit: object,
        batch_id: str,
        body: bytes,
        secret: str | None,
        events: int,
    ) -> bool:
        """POST the batch (no transaction open), then record the outcome; whether it was a 2xx."""
        started_at = self.app.now()
        request = batch_request(
            subscription.url,
            body,
            batch_id=batch_id,
            timestamp=int(started_at.timestamp()),
            secret=secret,
        )
        result = deliver(
            self.session,
            request,
            timeout=self.app.settings.subscription_timeout,
            max_response_bytes=self.app.settings.max_response_body,
            started_at=started_at,
        )
        delivered = result.outcome is Outcome.DELIVERED
        now = self.app.now()
        with writing(self.app) as conn:
            self.seam.record(conn, subscription, permit, result)
            if delivered:
                current = sending.acknowledge(conn, subscription.name, batch_id, at=now)
            else:
                delay = backoff(self.policy, subscription.failures_in_a_row + 1, self.rng)
                if result.call is not None and result.call.retry_after is not None:
                    delay = max(delay, result.call.retry_after)  # a 429 or 503 asked for more
                current = sending.record_failure(
                    conn,
                    subscription.name,
                    batch_id,
                    error=result.error or f"status {result.status}",
                    at=now,
                    retry_at=now + delay,
                )
        if self.app.metrics is not None:
            self.app.metrics.observe_subscription_batch(
                subscription.name, result.status, events=events, acknowledged=delivered and current
            )
        if not current:
            logger.info(
                "subscription %s: batch %s was superseded while it was sent (%s)",
                subscription.name,
                batch_id,
                "acknowledged" if delivered else "failed",
            )
        elif not delivered:
            logger.warning(
                "subscription %s: batch %s failed: %s", subscription.name, batch_id, result.error
            )
        return delivered and current

    def _wait(
        self, subscription: Subscription, due_at: datetime.datetime, *, error: str | None = None
    ) -> None:
        with writing(self.app) as conn:
            self._wait_in(conn, subscription, due_at, error=error)

    def _wait_in(
        self,
        conn: sa.Connection,
        subscription: Subscription,
        due_at: datetime.datetime,
        *,
        error: str | None = None,
    ) -> None:
        token = subscription.lease_token
        assert token is not None
        if error is None:
            sending.wait_until(conn, subscription.name, token, due_at=due_at)
        else:
            sending.wait_with_error(conn, subscription.name, token, due_at=due_at, error=error)
