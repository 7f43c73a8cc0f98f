"""The worker's main loop: fire clock triggers, claim due work, deliver, repeat.

One process runs one :class:`Worker`. The loop never blocks on HTTP itself:
deliveries and feed-reading evaluations run in a thread pool of
``delivery_concurrency`` threads sharing one keep-alive ``requests.Session``.
When idle it waits for ``NOTIFY routemaster_due`` (sent as a label enters an
action) or at most ``poll_interval`` seconds.
"""

from __future__ import annotations

import datetime
import logging
import random
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

import requests.adapters
import schedule
import sqlalchemy as sa

from routemaster import labels
from routemaster.app import App
from routemaster.config.model import Action, Gate, IntervalTrigger, MetadataTimezone, TimeTrigger
from routemaster.worker import claims
from routemaster.worker.delivery import deliver_claim
from routemaster.worker.evaluation import evaluate_due_gates, evaluate_leased
from routemaster.worker.triggers import (
    ScheduledTrigger,
    due_time_occurrence,
    fixed_zone,
    interval_occurrence,
    label_zone,
    scheduled_triggers,
)

logger = logging.getLogger(__name__)

ZONE_REFRESH_SECONDS = 60
MIN_OCCURRENCE_RETENTION = datetime.timedelta(days=7)


def run_worker(app: App) -> None:
    """Run until SIGTERM or SIGINT, then finish in-flight work and return."""
    worker = Worker(app)
    restore = _install_signal_handlers(worker.stop)
    try:
        worker.run()
    finally:
        restore()


class Worker:
    """One worker process's state: what it has in flight and which occurrences it has seen."""

    def __init__(self, app: App, *, rng: random.Random | None = None) -> None:
        self.app = app
        self.rng = rng or random.Random()
        self.stopping = threading.Event()
        self.action_states = [
            (machine.name, state.name)
            for machine in app.config.state_machines
            for state in machine.states
            if isinstance(state, Action)
        ]
        self.gate_states = [
            (machine.name, state.name)
            for machine in app.config.state_machines
            for state in machine.states
            if isinstance(state, Gate)
        ]
        self.triggers = list(scheduled_triggers(app.config))
        self.fixed_zones = {  # resolved once: the system zone is read from disk
            s.key: fixed_zone(s.trigger.timezone)
            for s in self.triggers
            if isinstance(s.trigger, TimeTrigger)
            and not isinstance(s.trigger.timezone, MetadataTimezone)
        }
        self.zones: dict[str, list[str]] = {}  # per-label-zone trigger key -> zones seen
        self.handled: dict[str, datetime.datetime] = {}  # occurrence key -> latest handled
        self.concurrency = app.settings.delivery_concurrency
        self.claim_batch = max(1, self.concurrency // 2)  # deliveries claimed at a time
        self.in_flight = 0
        self.slot_freed = threading.Event()
        self.lock = threading.Lock()
        self.delivered: list[tuple[str, str, int]] = []  # (machine, label, entry), to move on
        self.next_interval_at: datetime.datetime | None = None  # the loop wakes for it
        self.scheduler = schedule.Scheduler()
        # In this order, so that at start-up the zones are known before triggers fire.
        self.scheduler.every(ZONE_REFRESH_SECONDS).seconds.do(self.housekeeping)
        self.scheduler.every(1).seconds.do(self.fire_triggers)
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=self.concurrency, pool_maxsize=self.concurrency
        )
        app.http.mount("http://", adapter)
        app.http.mount("https://", adapter)

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once in-flight work is done."""
        self.stopping.set()
        self.slot_freed.set()

    def run(self) -> None:
        logger.info(
            "worker %s started: %d action states, %d clock triggers",
            self.app.settings.worker_id,
            len(self.action_states),
            len(self.triggers),
        )
        listener = DueListener(self.app.db)
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="routemaster-delivery")
        try:
            first = True
            while not self.stopping.is_set():
                try:
                    if first:
                        self.scheduler.run_all()  # triggers and zones from the start
                        first = False
                    self.scheduler.run_pending()
                    if self.next_interval_at and self.app.now() >= self.next_interval_at:
                        self.fire_triggers()
                    moved = self.move_delivered()
                    if self.work_once(pool) or moved:
                        continue
                except sa.exc.SQLAlchemyError:
                    # The database is away (restart, failover): keep trying, slowly.
                    logger.exception("database error in the worker loop; retrying")
                    self.stopping.wait(self.app.settings.poll_interval)
                    continue
                if self.in_flight:
                    # Due work that sent no NOTIFY (retries, bulk loads) is claimed as
                    # soon as deliveries free a batch of slots.
                    self.wait_for_free_slots(self._idle_timeout())
                else:
                    listener.wait(self._idle_timeout())
        finally:
            logger.info("worker %s stopping: finishing in-flight work", self.app.settings.worker_id)
            pool.shutdown(wait=True)
            self.move_delivered()
            listener.close()

    def wait_for_free_slots(self, timeout: float) -> None:
        """Until half the delivery slots are free (the claim batch), or ``timeout``.

        Going round the loop for every single finished delivery would cost a
        transaction to record it and one to claim its successor each time.
        """
        deadline = time.monotonic() + timeout
        while (
            self.in_flight
            and self.concurrency - self.in_flight < self.claim_batch
            and not self.stopping.is_set()
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.slot_freed.wait(remaining)
            self.slot_freed.clear()

    def move_delivered(self) -> bool:
        """Move labels whose webhooks succeeded on, all in one transaction; whether any."""
        with self.lock:
            delivered, self.delivered = self.delivered, []
        if not delivered:
            return False
        try:
            labels.complete_actions(self.app, delivered)
        except Exception:
            # Their leases run out and they are delivered again (same token): at least once.
            logger.exception("recording %d deliveries failed", len(delivered))
        return True

    def work_once(self, pool: ThreadPoolExecutor) -> bool:
        """Claim and start one round of work; whether there was any."""
        settings = self.app.settings
        now = self.app.now()
        free = self.concurrency - self.in_flight
        actions: list[claims.Claim] = []
        if free >= self.claim_batch or (free and not self.in_flight):
            with self.app.db.begin() as conn:
                actions = claims.claim_actions(
                    conn,
                    self.action_states,
                    limit=free,
                    now=now,
                    lease_until=now + settings.lease,
                    worker_id=settings.worker_id,
                )
        for claim in actions:
            self._submit(pool, self._deliver, claim)
        evaluated, leased = evaluate_due_gates(
            self.app, self.gate_states, limit=settings.batch_size
        )
        for key in leased:
            self._submit(pool, evaluate_leased, self.app, key)
        return bool(actions) or evaluated > 0

    def _deliver(self, claim: claims.Claim) -> None:
        if deliver_claim(self.app, claim, self.rng):
            with self.lock:
                self.delivered.append((claim.state_machine, claim.name, claim.entry_id))

    def fire_triggers(self) -> None:
        """Record each trigger's current occurrence; the first worker to do so marks labels due."""
        now = self.app.now()
        next_interval_at = None
        for scheduled in self.triggers:
            trigger = scheduled.trigger
            if isinstance(trigger, IntervalTrigger):
                latest = interval_occurrence(now, trigger.interval)
                self._fire(scheduled, scheduled.key, latest)
                following = latest + trigger.interval
                next_interval_at = min(following, next_interval_at or following)
            elif isinstance(trigger.timezone, MetadataTimezone):
                for name in self.zones.get(scheduled.key, []):
                    zone = label_zone(name)
                    if zone is not None:
                        occurrence = due_time_occurrence(now, trigger.time, zone)
                        self._fire(
                            scheduled,
                            f"{scheduled.key}/{name}",
                            occurrence,
                            zone=(trigger.timezone.path[1:], name),
                        )
            else:
                occurrence = due_time_occurrence(now, trigger.time, self.fixed_zones[scheduled.key])
                self._fire(scheduled, scheduled.key, occurrence)
        self.next_interval_at = next_interval_at

    def housekeeping(self) -> None:
        """Refresh the zones labels name for per-label time triggers; forget old occurrences."""
        with self.app.db.begin() as conn:
            for scheduled in self.triggers:
                trigger = scheduled.trigger
                if isinstance(trigger, IntervalTrigger) or not isinstance(
                    trigger.timezone, MetadataTimezone
                ):
                    continue
                self.zones[scheduled.key] = claims.zones_in_gate(
                    conn, scheduled.machine.name, scheduled.state, trigger.timezone.path[1:]
                )
            claims.forget_occurrences(conn, self.app.now() - self._occurrence_retention())

    def _fire(
        self,
        scheduled: ScheduledTrigger,
        key: str,
        occurrence: datetime.datetime | None,
        *,
        zone: tuple[tuple[str, ...], str] | None = None,
    ) -> None:
        """Handle ``occurrence`` unless some worker already has.

        ``zone`` (metadata path, zone name) limits it to labels in that zone.
        """
        if occurrence is None or self.handled.get(key) == occurrence:
            return
        with self.app.db.begin() as conn:
            first = claims.record_occurrence(conn, key, occurrence)
            if first:
                count = claims.mark_gate_due(
                    conn,
                    scheduled.machine.name,
                    scheduled.state,
                    now=self.app.now(),
                    zone_path=zone[0] if zone else None,
                    zone=zone[1] if zone else None,
                )
                conn.execute(sa.text(f"NOTIFY {labels.DUE_CHANNEL}"))
        self.handled[key] = occurrence
        if first:
            logger.info(
                "trigger %s fired for %s: %d labels due", key, occurrence.isoformat(), count
            )

    def _occurrence_retention(self) -> datetime.timedelta:
        intervals = [
            s.trigger.interval for s in self.triggers if isinstance(s.trigger, IntervalTrigger)
        ]
        return max([MIN_OCCURRENCE_RETENTION, *(2 * interval for interval in intervals)])

    def _idle_timeout(self) -> float:
        until_next_job = self.scheduler.idle_seconds
        timeout = self.app.settings.poll_interval
        if until_next_job is not None:
            timeout = min(timeout, max(until_next_job, 0.0))
        if self.next_interval_at is not None:
            # Wake on the occurrence itself, not up to a second after it.
            until_interval = (self.next_interval_at - self.app.now()).total_seconds()
            timeout = min(timeout, max(until_interval, 0.0))
        return timeout

    def _submit(self, pool: ThreadPoolExecutor, task: Callable[..., None], *args: Any) -> None:
        with self.lock:
            self.in_flight += 1

        def run() -> None:
            try:
                task(*args)
            except Exception:
                logger.exception("worker task %s failed", task.__name__)
            finally:
                with self.lock:
                    self.in_flight -= 1
                self.slot_freed.set()

        pool.submit(run)


class DueListener:
    """``LISTEN routemaster_due`` on a dedicated connection; plain sleeping if that fails."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.connection: Any = None
        self.proxy: Any = None

    def wait(self, timeout: float) -> None:
        """Return when a label became due, or after ``timeout`` seconds."""
        if timeout <= 0:
            return
        try:
            connection = self._connect()
            readable, _, _ = select.select([connection], [], [], timeout)
            if readable:
                connection.poll()
                connection.notifies.clear()
        except Exception:
            logger.warning("LISTEN connection failed; polling instead", exc_info=True)
            self.close()
            threading.Event().wait(timeout)

    def close(self) -> None:
        if self.proxy is not None:
            try:
                self.proxy.close()
            except Exception:
                logger.debug("closing the LISTEN connection failed", exc_info=True)
        self.proxy = self.connection = None

    def _connect(self) -> Any:
        if self.connection is None:
            proxy = self.engine.raw_connection()
            connection = proxy.driver_connection
            assert connection is not None
            proxy.detach()  # its session state (LISTEN, autocommit) must not go back to the pool
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {labels.DUE_CHANNEL}")
            self.proxy, self.connection = proxy, connection
        return self.connection


def _install_signal_handlers(stop: Callable[[], None]) -> Callable[[], None]:
    """SIGTERM and SIGINT stop the worker gracefully; returns a function restoring the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handle(signum: int, frame: FrameType | None) -> None:
        logger.info("received signal %d", signum)
        stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
