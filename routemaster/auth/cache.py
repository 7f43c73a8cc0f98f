"""What an API process checks bearer tokens against: every token, in memory, kept current.

Checking a token costs no database round trip: the process holds every
token (key id, hash, scopes) in a dictionary. A background thread
``LISTEN``\\ s for changes on its own connection (to PostgreSQL directly:
``App.direct``) and reloads the dictionary when a token is created or
revoked, then acknowledges, which is how ``routemaster token revoke`` knows
every process has stopped accepting it. With no direct connection (behind a
transaction-mode pooler, which delivers no notifications) the thread reloads
the tokens every ``poll_every`` seconds instead: a revocation takes effect
within that bound. While the thread cannot read the database (at start-up,
during an outage) the cache cannot know it is current, so each check reads
the tokens from the database instead: slower, never stale.

When each token was last used is kept in memory and written in one
statement every ``record_every`` seconds, not once per request.
"""

from __future__ import annotations

import datetime
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.auth.keys import key_id_of, matches
from routemaster.db import tokens as store

logger = logging.getLogger(__name__)

RECONNECT_DELAY = 1.0  # seconds between attempts to re-establish the LISTEN connection


@dataclass(frozen=True)
class Token:
    """Who a request is authenticated as."""

    name: str
    scopes: frozenset[str]


@dataclass(frozen=True)
class _Entry:
    token: Token
    secret_hash: str


class TokenCache:
    def __init__(
        self,
        engine: sa.Engine,
        *,
        direct: sa.Engine | None = None,
        record_every: float = 30.0,
        poll_every: float = 1.0,
    ) -> None:
        self._engine = engine
        self._direct = direct
        self._record_every = record_every
        self._poll_every = poll_every
        self._reset()
        reference = weakref.ref(self)

        def reset_after_fork() -> None:
            # The listening thread does not survive a fork; the child starts its own.
            cache = reference()
            if cache is not None:
                cache._reset()

        os.register_at_fork(after_in_child=reset_after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, _Entry] = {}
        self._current = threading.Event()  # set while listening, or while polling succeeds
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._thread: threading.Thread | None = None
        self._used: dict[str, float] = {}  # key id -> time.time() of its last use

    def authenticate(self, secret: str) -> Token | None:
        """The token whose secret this is; ``None`` for an unknown or malformed secret."""
        key_id = key_id_of(secret)
        if key_id is None:
            return None
        entry = self._entries().get(key_id)
        if entry is None or not matches(secret, entry.secret_hash):
            return None
        self._used[key_id] = time.time()
        return entry.token

    def start(self) -> None:
        """Start listening (in this process; a forked child starts its own on first use)."""
        self._start_once()

    def wait_until_current(self, timeout: float) -> bool:
        """Start listening if needed; whether the cache is kept current within ``timeout``."""
        self._start_once()
        return self._current.wait(timeout)

    def record_uses(self) -> None:
        """Write the pending last-used times in one statement."""
        used, self._used = self._used, {}
        if not used:
            return
        try:
            with self._engine.begin() as conn:
                store.record_use(
                    conn,
                    {
                        key_id: datetime.datetime.fromtimestamp(at, datetime.UTC)
                        for key_id, at in used.items()
                    },
                )
        except sa.exc.SQLAlchemyError:
            logger.warning("could not record when tokens were last used; will try again")
            for key_id, at in used.items():
                self._used.setdefault(key_id, at)

    def close(self) -> None:
        """Stop listening and write the pending last-used times."""
        self._stopping.set()
        os.write(self._wake_write, b"x")
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.record_uses()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _entries(self) -> Mapping[str, _Entry]:
        self._start_once()
        if self._current.is_set():
            return self._tokens
        return self._load()  # not listening (yet): the database is the only sure answer

    def _start_once(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._listen, name="routemaster-token-cache", daemon=True
                )
                self._thread.start()

    def _load(self) -> dict[str, _Entry]:
        with self._engine.connect() as conn:
            rows = store.all_tokens(conn)
        return {row.key_id: _Entry(Token(row.name, row.scopes), row.secret_hash) for row in rows}

    def _listen(self) -> None:
        recorded = time.monotonic()
        while not self._stopping.is_set():
            listener: store.ChangeListener | None = None
            try:
                if self._direct is not None:
                    listener = store.ChangeListener(
                        self._direct, store.CHANGED_CHANNEL, name=store.LISTENER_NAME
                    )
                self._tokens = self._load()  # loaded after LISTEN: no change falls between
                self._current.set()
                while not self._stopping.is_set():
                    pause = max(0.0, self._record_every - (time.monotonic() - recorded))
                    watched = [self._wake_read]
                    if listener is None:
                        pause = min(pause, self._poll_every)
                    else:
                        watched.append(listener.fileno())
                    readable, _, _ = select.select(watched, [], [], pause)
                    if listener is None:
                        self._tokens = self._load()
                    elif watched[1] in readable:
                        changes = listener.payloads()
                        if changes:
                            self._tokens = self._load()
                            listener.acknowledge(changes)
                    if time.monotonic() - recorded >= self._record_every:
                        self.record_uses()
                        recorded = time.monotonic()
            except Exception as error:
                if self._current.is_set():
                    logger.warning(
                        "token cache lost its database connection (%s); checking tokens "
                        "against the database until it is back",
                        type(error).__name__,
                    )
                self._current.clear()
                self._stopping.wait(RECONNECT_DELAY)
            finally:
                self._current.clear()
                if listener is not None:
                    try:
                        listener.close()
                    except Exception:
                        logger.debug("closing the token listener failed", exc_info=True)
