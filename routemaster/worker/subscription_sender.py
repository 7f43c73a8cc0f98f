"""The worker's push-subscription sender: a thread that claims subscriptions and sends batches.

Every ``subscription_poll`` seconds (20 ms by default) the sender looks at the
stream and the subscriptions in one cheap read (:func:`routemaster.service.batch_sending.look`).
When the stream grew, or a subscription's time came (its batch delay, its
backoff), it claims as many subscriptions as it has free threads, each under
a lease (:mod:`routemaster.db.subscription_batches`), so any number of workers
share them and one subscription has one batch in flight. Each claimed subscription is
handled in a thread (:class:`~routemaster.service.batch_sending.BatchSender`); the
lease outlasts a send's total deadline, and a worker that dies lets its lease
run out, after which another worker sends the same batch again.

A short poll rather than ``LISTEN``: a ``NOTIFY`` in every write transaction
would serialise their commits (see :mod:`routemaster.hubs.changes`).
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from routemaster.app import App
from routemaster.http.guard import AddressPolicy
from routemaster.http.subscription_batches import subscription_session
from routemaster.service.batch_sending import (
    BatchSender,
    ReceiverSeam,
    claim_subscriptions,
    give_back,
    look,
)
from routemaster.service.database import StoreError
from routemaster.service.subscription_receivers import SubscriptionReceivers
from routemaster.service.subscriptions import Subscription

logger = logging.getLogger(__name__)


class SubscriptionSender:
    """Started and stopped by the worker; runs beside its loop in a thread of its own."""

    def __init__(
        self,
        app: App,
        *,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
        seam: ReceiverSeam | None = None,
    ) -> None:
        self.app = app
        settings = app.settings
        self.size = settings.subscription_concurrency
        self._session = subscription_session(
            AddressPolicy(app.config.subscriptions.allow), self.size
        )
        self._stopping = threading.Event()
        self._batches = BatchSender(
            app,
            self._session,
            rng=rng or random.Random(),
            environ=os.environ if environ is None else environ,
            seam=seam or SubscriptionReceivers(app),
            stopping=self._stopping,
        )
        self._pool = ThreadPoolExecutor(self.size, thread_name_prefix="routemaster-subscription")
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._wake = threading.Event()
        self._seen: tuple[int | None, int] | None = None
        self._thread: threading.Thread | None = None
        self._failing = False
        self._any = False
        self._next_due: datetime.datetime | None = None

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def start(self) -> None:
        settings = self.app.settings
        if settings.subscription_lease <= settings.subscription_timeout:
            logger.warning(
                "ROUTEMASTER_SUBSCRIPTION_LEASE (%g s) is not longer than "
                "ROUTEMASTER_SUBSCRIPTION_TIMEOUT (%g s): a slow subscriber may get a batch "
                "from two workers at once",
                settings.subscription_lease,
                settings.subscription_timeout,
            )
        self._thread = threading.Thread(target=self._run, name="routemaster-subscriptions")
        self._thread.daemon = True
        self._thread.start()

    def stop_sending(self) -> None:
        """From now on claim and send nothing: a subscription claimed but not sent is given
        back, due at once. Returns at once (a signal handler calls it)."""
        self._stopping.set()
        self._wake.set()

    def stop(self) -> None:
        """:meth:`stop_sending`, then wait for the batches in flight (each within its deadline)."""
        self.stop_sending()
        if self._thread is not None:
            self._thread.join()
        self._pool.shutdown(wait=True)
        self._session.close()

    def _run(self) -> None:
        poll = self.app.settings.subscription_poll
        while not self._stopping.is_set():
            try:
                self.round()
                if self._failing:
                    logger.info("subscriptions: the database answers again")
                self._failing = False
            except StoreError as error:
                if not self._failing:
                    logger.error("subscriptions: database unavailable: %s", type(error).__name__)
                self._failing = True
                self._wake.wait(self.app.settings.poll_interval)
            except Exception:
                self.app.hooks.exception("the subscription sender failed")
                logger.exception("the subscription sender failed")
                self._wake.wait(self.app.settings.poll_interval)
            # With no subscription at all, look again only every poll interval (1 s); else
            # every poll, or sooner when a subscription falls due before it.
            sleep = poll if self._any else self.app.settings.poll_interval
            if self._next_due is not None:
                until_due = (self._next_due - self.app.now()).total_seconds()
                sleep = min(sleep, max(until_due, 0.001))
            self._wake.wait(sleep)
            self._wake.clear()

    def round(self) -> int:
        """Look, and claim what may have work; how many subscriptions were claimed."""
        now = self.app.now()
        seen = look(self.app, now)
        self._any = seen.subscribed
        self._next_due = (
            seen.next_due if seen.next_due is not None and seen.next_due > now else None
        )
        news = seen.stream != self._seen
        due = seen.next_due is not None and seen.next_due <= now
        free = self.size - self.in_flight
        if not (news or due) or free <= 0 or self._stopping.is_set():
            return 0
        token = uuid.uuid4().hex
        claimed = claim_subscriptions(self.app, token=token, now=now, news=news, limit=free)
        if self._stopping.is_set():  # stopped during the claim: none of them is sent
            give_back(self.app, claimed, token)
            return 0
        if len(claimed) < free:  # every subscription that could have news was looked at
            self._seen = seen.stream
        for subscription in claimed:
            with self._lock:
                self._in_flight.add(subscription.name)
            self._pool.submit(self._handle, subscription)
        return len(claimed)

    def _handle(self, subscription: Subscription) -> None:
        try:
            self._batches.handle(subscription)
        except StoreError as error:  # its lease runs out; another round sends it
            logger.warning(
                "subscription %s: the database failed: %s", subscription.name, type(error).__name__
            )
        except Exception:
            message = f"subscription {subscription.name}: sending failed"
            logger.exception(message)
            self.app.hooks.exception(message)
        finally:
            with self._lock:
                self._in_flight.discard(subscription.name)
            self._wake.set()
