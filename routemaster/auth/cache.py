"""What an API process checks bearer tokens against: every token, in memory, kept current.

Checking a token costs no database round trip: the process holds every
token (key id, hash, scopes) in a dictionary. A background thread keeps it
current. Where ``LISTEN`` works (it checks that it does, and keeps checking:
:class:`routemaster.db.notifications.Listener`, on ``DATABASE_URL`` or the
direct URL if one is given) it reloads the dictionary when a token is
created or revoked, then acknowledges, which is how ``routemaster token
revoke`` knows every process has stopped accepting it. Where it does not
(a transaction-mode pooler delivers no notifications) the thread reloads
the tokens every ``poll_every`` seconds instead: a revocation takes effect
within that bound. While the thread cannot read the database (at start-up,
during an outage) the cache cannot know it is current, so each check reads
the tokens from the database instead: slower, never stale.

A secret whose key id the dictionary lacks may be a token made a moment
ago that this process has not heard of yet: that one token is read from
the database before the secret is refused, so a new token works at its
first use in every process. Misses are bounded so that random secrets
cannot become a database load: a key id found missing is not looked up
again for :data:`MISS_MEMORY` seconds, and at most :data:`MISS_READS` look-ups
run per second per process (beyond that a miss is refused without one).

When each token was last used is kept in memory and written in one
statement every ``record_every`` seconds, not once per request.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.auth.token_secrets import key_id_of, matches
from routemaster.db import tokens as store
from routemaster.db.statements import single_statement

logger = logging.getLogger(__name__)

RECONNECT_DELAY = 1.0  # seconds before the thread tries the database again after a failure
MISS_READS = 20  # look-ups of unknown key ids per second per process, at most
MISS_MEMORY = 60.0  # seconds a key id found missing is refused without a look-up
MISS_REMEMBERED = 10_000  # key ids remembered as missing, at most (then forgotten at once)


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
        on_listening: Callable[[bool], None] | None = None,
    ) -> None:
        self._engine = engine
        self._direct = direct
        self._on_listening = on_listening
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
        self._generation = 0  # bumped by every reload: a look-up older than it is not kept
        self._missing: dict[str, float] = {}  # key id -> time.monotonic() it was found missing
        self._reads: list[float] = []  # time.monotonic() of this second's look-ups

    def authenticate(self, secret: str) -> Token | None:
        """The token whose secret this is; ``None`` for an unknown or malformed secret."""
        key_id = key_id_of(secret)
        if key_id is None:
            return None
        entry = self._entries().get(key_id)
        if entry is None and self._current.is_set():
            entry = self._look_up(key_id)
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

    def _look_up(self, key_id: str) -> _Entry | None:
        """The token of ``key_id`` from the database, made since the last reload; bounded."""
        now = time.monotonic()
        with self._lock:
            missing_since = self._missing.get(key_id)
            if missing_since is not None and now - missing_since < MISS_MEMORY:
                return None
            self._reads = [at for at in self._reads if now - at < 1.0]
            if len(self._reads) >= MISS_READS:
                return None
            self._reads.append(now)
            generation = self._generation
        try:
            with single_statement(self._engine) as conn:
                stored = store.token_by_key_id(conn, key_id)
        except sa.exc.SQLAlchemyError:
            logger.warning("could not look up an unknown token; refused")
            return None
        with self._lock:
            if stored is None:
                if len(self._missing) >= MISS_REMEMBERED:
                    self._missing.clear()
                self._missing[key_id] = now
                return None
            entry = _Entry(Token(stored.name, stored.scopes), stored.secret_hash)
            if generation == self._generation:  # else a reload since may have left it out
                self._tokens = {**self._tokens, key_id: entry}
        return entry

    def _replace(self, tokens: dict[str, _Entry]) -> None:
        with self._lock:
            self._tokens = tokens
            self._generation += 1

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
            listener = store.change_listener(
                self._direct or self._engine, self._engine, self._on_listening
            )
            try:
                self._replace(self._load())
                loaded = time.monotonic()
                self._current.set()
                while not self._stopping.is_set():
                    was_listening = listener.listening
                    now = time.monotonic()
                    pause = max(0.0, self._record_every - (now - recorded))
                    if not was_listening:
                        pause = min(pause, max(0.0, self._poll_every - (now - loaded)))
                    heard = listener.wait(pause, [self._wake_read])
                    since = time.monotonic() - loaded
                    polled = not listener.listening and since >= self._poll_every
                    # Reloaded after the LISTEN took effect: no change falls between.
                    if heard.payloads or polled or (listener.listening and not was_listening):
                        self._replace(self._load())
                        loaded = time.monotonic()
                        if heard.payloads and listener.listening:
                            store.acknowledge(listener, heard.payloads)
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
                listener.close()
