"""What the ``routemaster token`` commands do: create, list and revoke tokens.

A change is committed together with a ``NOTIFY``; then the command waits
(briefly) until every API process that was listening has reloaded and said
so, and reports how many did. A process that has not answered in time still
reloads as soon as it reads its connection; a process started later loads
the tokens as they are then. The command listens for the answers on
``DATABASE_URL`` (or the direct URL if given) once a probe shows that
notifications arrive there (:mod:`routemaster.db.notifications`); where
they do not (a transaction-mode pooler) nothing is confirmed: API
processes poll, and apply the change within their poll interval. Either
way a new token works at its first use: a process reads a token it does
not know from the database (:mod:`routemaster.auth.cache`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

import sqlalchemy as sa

from routemaster.auth.token_secrets import SCOPES, NewSecret, new_secret
from routemaster.db import tokens as store
from routemaster.db.notifications import Listener
from routemaster.db.tokens import StoredToken, TokenExists

__all__ = [
    "Confirmation",
    "InvalidToken",
    "TokenExists",
    "create_token",
    "list_tokens",
    "revoke_token",
]

MAX_NAME_LENGTH = 200

T = TypeVar("T")


class InvalidToken(ValueError):
    """A name or scope the command cannot accept."""


@dataclass(frozen=True)
class Confirmation:
    """How many API processes were listening, and how many confirmed the change in time."""

    listening: int
    confirmed: int
    polled: bool = False  # no notifications here (a pooler): processes poll, none confirms

    @property
    def complete(self) -> bool:
        return self.confirmed >= self.listening


def create_token(
    engine: sa.Engine,
    name: str,
    scopes: Collection[str],
    *,
    wait: float = 10.0,
    direct: sa.Engine | None = None,
) -> tuple[NewSecret, Confirmation]:
    """A new token; :class:`TokenExists` if the name is taken."""
    _check(name, scopes)
    secret = new_secret()

    def insert(conn: sa.Connection) -> None:
        store.insert_token(
            conn, name=name, key_id=secret.key_id, secret_hash=secret.hash, scopes=scopes
        )

    _, confirmation = _change(engine, direct, insert, wait)
    return secret, confirmation


def revoke_token(
    engine: sa.Engine, name: str, *, wait: float = 10.0, direct: sa.Engine | None = None
) -> Confirmation | None:
    """Delete the token; ``None`` when there is no token of that name."""

    def delete(conn: sa.Connection) -> bool:
        return store.delete_token(conn, name)

    deleted, confirmation = _change(engine, direct, delete, wait)
    return confirmation if deleted else None


def list_tokens(engine: sa.Engine) -> list[StoredToken]:
    with engine.connect() as conn:
        return store.all_tokens(conn)


def _check(name: str, scopes: Collection[str]) -> None:
    if not name or len(name) > MAX_NAME_LENGTH or not name.isprintable() or name != name.strip():
        raise InvalidToken(
            f"a token name is 1 to {MAX_NAME_LENGTH} printable characters, "
            "without leading or trailing spaces"
        )
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidToken(f"scopes must be some of {', '.join(SCOPES)}; got {sorted(scopes)}")


def _change(
    engine: sa.Engine, direct: sa.Engine | None, apply: Callable[[sa.Connection], T], wait: float
) -> tuple[T, Confirmation]:
    """Apply, notify on commit, then collect acknowledgements for up to ``wait`` seconds."""
    change = uuid.uuid4().hex
    listener = store.ack_listener(direct or engine, engine)  # before the change commits
    try:
        checked_by = time.monotonic() + listener.check_within
        while not listener.listening and time.monotonic() < checked_by:
            listener.wait(min(0.05, max(0.0, checked_by - time.monotonic())))
        with engine.begin() as conn:
            # each counted process has LISTENed and checked it, so each will hear the change
            listening = store.count_listeners(conn) if listener.listening else 0
            result = apply(conn)
            store.notify_changed(conn, change)
        if not listener.listening:
            return result, Confirmation(listening=0, confirmed=0, polled=True)
        confirmed = _acknowledgements(listener, change, listening, time.monotonic() + wait)
    finally:
        listener.close()
    return result, Confirmation(listening=listening, confirmed=confirmed)


def _acknowledgements(listener: Listener, change: str, wanted: int, deadline: float) -> int:
    confirmed = 0
    while confirmed < wanted:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        confirmed += sum(1 for payload in listener.wait(remaining).payloads if payload == change)
    return confirmed
