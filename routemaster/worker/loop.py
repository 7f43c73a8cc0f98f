"""The worker's loop: run a round, sleep, stop (a round: :mod:`~routemaster.worker.round`).

One process runs one :class:`Worker`. The loop itself never waits on HTTP:
deliveries and feed-reading evaluations run in slots. When a round finds
nothing to do, the loop sleeps in one ``select`` until a label becomes due
(``NOTIFY``), a slot finishes, the next scheduled step, or the next known
due time, whichever is first (at most ``poll_interval``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from routemaster.app import App
from routemaster.http.client import BoundedAdapter
from routemaster.service.database import StoreError
from routemaster.service.versions import load_all_versions, worker_view
from routemaster.service.wakeups import listen_for_due, next_due_at, tell_idle_shards
from routemaster.worker.round import Round, Work
from routemaster.worker.subscription_sender import SubscriptionSender

logger = logging.getLogger(__name__)

OUTAGE_REMINDER_SECONDS = 60


class OutageLog:
    """The worker's log of the database's availability: one line per change of it, and a
    reminder each minute while it is away."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._down_since: float | None = None
        self._reminded_at = 0.0

    def down(self, error: Exception) -> None:
        now = self._clock()
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if self._down_since is None:
            self._down_since = self._reminded_at = now
            logger.error("database unavailable; the worker waits for it: %s", reason)
        elif now - self._reminded_at >= OUTAGE_REMINDER_SECONDS:
            self._reminded_at = now
            logger.error(
                "database still unavailable after %d s: %s", now - self._down_since, reason
            )

    def up(self) -> None:
        if self._down_since is not None:
            logger.info("database available again after %d s", self._clock() - self._down_since)
            self._down_since = None


class Worker:
    def __init__(self, app: App, *, rng: random.Random | None = None) -> None:
        self.app = app
        rng = rng or random.Random()
        self._stopping = threading.Event()
        # Older versions' states and clock triggers too, for labels of continue machines
        # created under them (SPEC E4): each is scheduled by its own version's gate.
        load_all_versions(app)
        self._work = Work(app, worker_view(app), rng=rng, stopping=self._stopping)
        self._round = Round(self._work)
        self._slots = self._work.slots
        self._outage = OutageLog()
        self.triggers = self._work.triggers
        self.minutely = self._work.minutely
        self.subscriptions = SubscriptionSender(app, rng=rng)
        # Bounded: every webhook and feed call has one total deadline (routemaster.http).
        adapter = BoundedAdapter(pool_connections=self._slots.size, pool_maxsize=self._slots.size)
        app.http.mount("http://", adapter)
        app.http.mount("https://", adapter)

    @property
    def in_flight(self) -> int:
        """Deliveries and feed-reading evaluations held by slots now."""
        return len(self._slots.held())

    def stop(self) -> None:
        """Stop claiming and sending; :meth:`run` returns once in-flight work is recorded.

        From any thread (a signal's, through :mod:`routemaster.worker.signals`): it takes
        locks, so never from a signal handler itself.
        """
        self._stopping.set()
        self._slots.wake()
        self.subscriptions.stop_sending()

    def run(self) -> None:
        logger.info(
            "worker %s started: %d action states, %d clock triggers",
            self.app.settings.worker_id,
            len(self._work.action_states),
            len(self.triggers.triggers),
        )
        listener = listen_for_due(self.app)
        self.subscriptions.start()
        first = True
        try:
            # Stopping, the loop goes on only to record (and lease) what is still in flight.
            while not self._stopping.is_set() or self._slots.held():
                try:
                    tell_idle_shards(self.app, listening=listener.listening)
                    busy = self.work_once(first=first)
                    first = False
                    tell_idle_shards(self.app, listening=listener.listening, busy=busy)
                    sleep = 0.0 if busy else self._sleep_for()
                    self._outage.up()
                except StoreError as error:
                    self._outage.down(error)
                    tell_idle_shards(self.app, listening=False)  # what it knew may be stale
                    busy, sleep = False, self.app.settings.poll_interval
                except Exception:
                    self.app.hooks.exception("the worker loop failed")
                    raise
                if not busy:
                    heard = listener.wait(sleep, [self._slots.wake_fd])
                    tell_idle_shards(
                        self.app, listening=listener.listening, payloads=heard.payloads
                    )
                    self._slots.clear_wake()
        finally:
            logger.info("worker %s stopping", self.app.settings.worker_id)
            self._slots.shutdown()
            self.subscriptions.stop()
            try:
                self._work.finish()
            except StoreError:
                logger.warning("could not record the last deliveries; they will be sent again")
            listener.close()
            logger.info("worker %s stopped", self.app.settings.worker_id)

    def work_once(self, *, first: bool = False) -> bool:
        """One round of :data:`~routemaster.worker.round.STEPS`; whether it found work.

        The first round of :meth:`run` runs every scheduled step. Once :meth:`stop`
        is called nothing new is claimed or sent: a round only records what slots
        finished, and work claimed meanwhile is given back.
        """
        self._work.take_delivered()
        return self._round.run(all_due=first)

    def _sleep_for(self) -> float:
        """Until the next scheduled step, interval occurrence or known due time; at most a poll."""
        timeout = self.app.settings.poll_interval
        now = self.app.now()
        until_step = self._round.idle_seconds()
        if until_step is not None:
            timeout = min(timeout, max(until_step, 0.0))
        if self._work.gate.wake_at is not None:  # a receiver's rate or cooldown: past means now
            timeout = min(timeout, max((self._work.gate.wake_at - now).total_seconds(), 0.0))
        for wake in (self.triggers.next_interval_at, next_due_at(self.app)):
            # A due time already past belongs to work another worker holds or this one
            # cannot take (a state it does not know): it must not make the loop spin.
            if wake is not None and wake > now:
                timeout = min(timeout, (wake - now).total_seconds())
        return timeout
