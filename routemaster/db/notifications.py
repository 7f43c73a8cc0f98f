"""``NOTIFY`` wake-ups, and a listener that checks it hears them before relying on them.

``NOTIFY routemaster_due`` is sent when work becomes due; it is a hint that
saves a worker a poll interval, and correctness never depends on it (work
is found by ``due_at`` either way). The same holds for token changes
(:mod:`routemaster.db.tokens`).

A :class:`Listener` listens on ``DATABASE_URL`` itself (or on
``ROUTEMASTER_DIRECT_DATABASE_URL`` when that is given), and does not take
on trust that notifications arrive: through a transaction-mode pooler
(PgBouncer ``pool_mode = transaction``) a ``LISTEN`` succeeds, but it
registers whichever server connection ran it, and no notification ever
reaches the listening client. So the listener first listens on
:data:`PROBE_CHANNEL` alone, sends a probe (a payload of its own) through
an ordinary pooled connection, and relies on its connection only once the
probe has come back within :attr:`Listener.check_within` seconds; only
then does it ``LISTEN`` on the channels it is for. It sends a probe again
every :attr:`Listener.check_every` seconds while it listens, and tries
again as often while it does not. Until the probe comes back, and whenever
it stops coming back, the caller's timeout (at most its poll interval) is
the wake-up bound: polling.

The probe channel is the only one a failed check leaves registered on a
pooler's server connection: a stray probe now and then may reach a pooled
client, which drops it (:mod:`routemaster.db.plumbing.database` clears
them at check-in); the busy channels are never listened to there.
"""

from __future__ import annotations

import datetime
import logging
import select
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import Params, coordinator_of, run, run_on_driver, single_statement

logger = logging.getLogger(__name__)

DUE_CHANNEL = "routemaster_due"
DUE_LATER_CHANNEL = "routemaster_due_later"
PROBE_CHANNEL = "routemaster_probe"

CHECK_EVERY = 30.0  # seconds between checks that LISTEN works (and retries while it does not)
CHECK_WITHIN = 5.0  # seconds a probe may take to come back before LISTEN is judged not to work
RECONNECT_AFTER = 1.0  # seconds before trying again when a listening connection was lost

_NOTIFY_DUE = "NOTIFY routemaster_due"

_NOTIFY_DUE_LATER = "SELECT pg_notify('routemaster_due_later', %(at)s)"

LISTEN_DUE = "LISTEN routemaster_due"

LISTEN_DUE_LATER = "LISTEN routemaster_due_later"

_LISTEN_PROBE = "LISTEN routemaster_probe"

_PROBE = "SELECT pg_notify('routemaster_probe', %(payload)s)"


def notify_due(conn: sa.Connection) -> None:
    """Wake listening workers when this transaction commits (in a write routed to a Citus
    node, when the coordinator's part of it does, just after)."""
    run(coordinator_of(conn), _NOTIFY_DUE)


def notify_due_times(
    conn: sa.Connection, due_ats: Iterable[datetime.datetime | None], *, now: datetime.datetime
) -> None:
    """Wake listening workers if one of ``due_ats`` has come; otherwise, on Citus only, tell
    them the earliest (``routemaster_due_later``): their quiet claims
    (:mod:`routemaster.db.idle_shards`) read again at that time. One server sends nothing for
    a later due time, as before: its workers read the next due time every round."""
    later = [at for at in due_ats if at is not None]
    if any(at <= now for at in later):
        notify_due(conn)
    elif later and distributed(conn):
        run(coordinator_of(conn), _NOTIFY_DUE_LATER, {"at": min(later).isoformat()})


@dataclass(frozen=True)
class Heard:
    """What ended a :meth:`Listener.wait`: readable descriptors, notifications' payloads."""

    fds: list[int] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)


class Listener:
    """``LISTEN`` on a dedicated connection, outside the pool, used only once checked.

    ``listen_on`` is the engine the connection comes from (``App.direct``
    if given, else ``App.db``); ``notify_through`` the pooled engine the
    probes go through. ``setup`` is what to run on the connection once the
    probe came back: the ``LISTEN`` statements it is for, and anything else
    that needs a real session (``SET application_name``). ``on_change`` is
    told whether wake-ups are by ``LISTEN`` (``True``) or polled, at once
    and on every change (the ``routemaster_wakeups_listening`` gauge).

    :meth:`wait` sleeps on the connection and on extra file descriptors in
    one ``select``, so a worker can wait for notifications and its own
    threads' wake-ups at once. If the connection fails, it sleeps on those
    alone and checks again later.
    """

    def __init__(
        self,
        listen_on: sa.Engine,
        notify_through: sa.Engine,
        setup: Sequence[tuple[str, Params]],
        *,
        what: str = "wake-ups",
        on_change: Callable[[bool], None] | None = None,
        check_every: float = CHECK_EVERY,
        check_within: float = CHECK_WITHIN,
    ) -> None:
        self._listen_on = listen_on
        self._notify_through = notify_through
        self._setup = list(setup)
        self._what = what
        self._on_change = on_change
        self.check_every = check_every
        self.check_within = check_within
        self._proxy: Any = None
        self._connection: Any = None
        self._listening = False
        self._ever_checked = False
        self._probe: str | None = None  # the payload of the probe awaited
        self._probe_deadline = 0.0
        self._next_check = 0.0  # time.monotonic(): at once
        if on_change is not None:
            on_change(False)

    @property
    def listening(self) -> bool:
        """Whether notifications are known to arrive (the last probe came back)."""
        return self._listening

    def wait(self, timeout: float, wake_fds: Sequence[int] = ()) -> Heard:
        """Sleep up to ``timeout`` seconds, until a notification or a readable ``wake_fds``."""
        end = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            self._tend(now)
            remaining = end - now
            if remaining <= 0:
                return Heard()
            watched: list[Any] = list(wake_fds)
            if self._connection is not None:
                watched.append(self._connection)
                step = (self._probe_deadline if self._probe else self._next_check) - now
            else:
                step = self._next_check - now
            readable, _, _ = select.select(watched, [], [], max(0.0, min(remaining, step)))
            fds = [fd for fd in readable if isinstance(fd, int)]
            payloads = self._read() if self._connection in readable else []
            if fds or payloads:
                return Heard(fds, payloads)

    def run(self, statement: str, params: Params) -> None:
        """Run ``statement`` on the listening connection (an acknowledgement); only while
        :attr:`listening`."""
        run_on_driver(self._connection, statement, params)

    def close(self) -> None:
        if self._proxy is not None:
            try:
                self._proxy.close()
            except Exception:
                logger.debug("closing the LISTEN connection failed", exc_info=True)
        self._proxy = self._connection = None
        self._probe = None

    def _tend(self, now: float) -> None:
        """Start a check when one is due; conclude one whose probe did not come back in time."""
        if self._probe is not None:
            if now >= self._probe_deadline:
                self._not_heard(now)
            return
        if now < self._next_check:
            return
        try:
            if self._connection is None:
                self._connect()
            payload = uuid.uuid4().hex
            with single_statement(self._notify_through) as conn:
                run(conn, _PROBE, {"payload": payload})
        except Exception as error:
            logger.debug("checking that LISTEN works failed", exc_info=True)
            self._lost(now, error)
            return
        self._probe, self._probe_deadline = payload, now + self.check_within

    def _connect(self) -> None:
        proxy = self._listen_on.raw_connection()
        try:
            connection: Any = proxy.driver_connection
            proxy.detach()  # its session state (LISTEN, autocommit) must not go back to the pool
            connection.autocommit = True
            run_on_driver(connection, _LISTEN_PROBE)
        except Exception:
            proxy.close()
            raise
        self._proxy, self._connection = proxy, connection

    def _read(self) -> list[str]:
        """The payloads of the notifications that arrived on the channels this listener is for."""
        try:
            self._connection.poll()
            notifies = list(self._connection.notifies)
            self._connection.notifies.clear()
        except Exception as error:
            logger.debug("LISTEN connection lost", exc_info=True)
            self._lost(time.monotonic(), error)
            return []
        payloads: list[str] = []
        for notify in notifies:
            if notify.channel != PROBE_CHANNEL:
                payloads.append(notify.payload)
            elif notify.payload == self._probe:
                self._heard()
        return payloads

    def _heard(self) -> None:
        self._probe = None
        self._next_check = time.monotonic() + self.check_every
        self._ever_checked = True
        if self._listening:
            return
        try:
            for statement, params in self._setup:
                run_on_driver(self._connection, statement, params)
        except Exception as error:
            self._lost(time.monotonic(), error)
            return
        self._listening = True
        logger.info("%s by LISTEN: notifications arrive", self._what)
        self._changed()

    def _not_heard(self, now: float) -> None:
        """The probe did not come back: a transaction-mode pooler, or a broken connection."""
        if self._listening:
            logger.warning(
                "%s polled: a probe NOTIFY did not come back within %gs; checking again in %gs",
                self._what,
                self.check_within,
                self.check_every,
            )
        elif not self._ever_checked:
            logger.info(
                "%s polled: LISTEN on this database URL delivers no notifications "
                "(a transaction-mode pooler?); checking again every %gs",
                self._what,
                self.check_every,
            )
        self._ever_checked = True
        self.close()
        self._next_check = now + self.check_every
        self._set_listening(False)

    def _lost(self, now: float, error: BaseException) -> None:
        if self._listening:
            logger.warning(
                "%s polled: the LISTEN connection failed (%s); trying again",
                self._what,
                type(error).__name__,
            )
        self.close()
        self._next_check = now + RECONNECT_AFTER
        self._set_listening(False)

    def _set_listening(self, listening: bool) -> None:
        if self._listening != listening:
            self._listening = listening
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self._listening)
            except Exception:
                logger.debug("reporting whether LISTEN works failed", exc_info=True)


def due_listener(
    listen_on: sa.Engine,
    notify_through: sa.Engine,
    on_change: Callable[[bool], None] | None = None,
    *,
    what: str = "wake-ups",
    later: bool = False,
) -> Listener:
    """A :class:`Listener` for ``routemaster_due``: labels becoming due; ``later``: also
    ``routemaster_due_later``, later due times written on Citus (a worker's loop)."""
    setup: list[tuple[str, Params]] = [(LISTEN_DUE, {})]
    if later:
        setup.append((LISTEN_DUE_LATER, {}))
    return Listener(listen_on, notify_through, setup, what=what, on_change=on_change)
