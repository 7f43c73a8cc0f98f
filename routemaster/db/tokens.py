"""API tokens: their rows, the ``NOTIFY`` that tells API processes of a change, and its answers.

Only a hash of each secret is stored. API processes keep every token in
memory and ``LISTEN`` on :data:`CHANGED_CHANNEL`; a command that creates or
revokes a token notifies that channel in the same transaction, and each
listening process answers on :data:`ACK_CHANNEL` once it has reloaded, so the
command can tell when every running process has the change.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.statements import fetch_all, fetch_one, fetch_value, run, run_on_driver

CHANGED_CHANNEL = "routemaster_tokens"
ACK_CHANNEL = "routemaster_tokens_ack"
LISTENER_NAME = "routemaster token cache"
"""The ``application_name`` of each API process's listening connection, to count them."""


@dataclass(frozen=True)
class StoredToken:
    name: str
    key_id: str
    secret_hash: str
    scopes: frozenset[str]
    created_at: datetime.datetime
    last_used_at: datetime.datetime | None


class TokenExists(Exception):
    """``token create`` with a name that is already taken."""


_INSERT = """
    INSERT INTO api_tokens (name, key_id, secret_hash, scopes)
    VALUES (%(name)s, %(key_id)s, %(secret_hash)s, %(scopes)s)
    ON CONFLICT (name) DO NOTHING
    """

_DELETE = "DELETE FROM api_tokens WHERE name = %(name)s"

_ALL = """
    SELECT name, key_id, secret_hash, scopes, created_at, last_used_at
    FROM api_tokens ORDER BY name
    """

_RECORD_USE = """
    UPDATE api_tokens SET last_used_at = greatest(last_used_at, used.at)
    FROM (SELECT unnest(CAST(%(key_ids)s AS text[])) AS key_id,
                 unnest(CAST(%(times)s AS timestamptz[])) AS at) AS used
    WHERE api_tokens.key_id = used.key_id
    """

_NOTIFY_CHANGED = "SELECT pg_notify('routemaster_tokens', %(change)s)"

_NOTIFY_ACK = "SELECT pg_notify('routemaster_tokens_ack', %(change)s)"

_LISTEN = {
    CHANGED_CHANNEL: "LISTEN routemaster_tokens",
    ACK_CHANNEL: "LISTEN routemaster_tokens_ack",
}

_SET_NAME = "SET application_name = %(name)s"

_LISTENERS = """
    SELECT count(*) FROM pg_stat_activity
    WHERE application_name = %(name)s AND datname = current_database()
    """


def insert_token(
    conn: sa.Connection, *, name: str, key_id: str, secret_hash: str, scopes: Iterable[str]
) -> None:
    """Store a new token; :class:`TokenExists` when the name is taken."""
    inserted = run(
        conn,
        _INSERT,
        {"name": name, "key_id": key_id, "secret_hash": secret_hash, "scopes": sorted(scopes)},
    )
    if inserted == 0:
        raise TokenExists(name)


def delete_token(conn: sa.Connection, name: str) -> bool:
    """Forget the token called ``name``; whether there was one."""
    return run(conn, _DELETE, {"name": name}) > 0


def all_tokens(conn: sa.Connection) -> list[StoredToken]:
    return [
        StoredToken(
            name=name,
            key_id=key_id,
            secret_hash=secret_hash,
            scopes=frozenset(scopes),
            created_at=created_at,
            last_used_at=last_used_at,
        )
        for name, key_id, secret_hash, scopes, created_at, last_used_at in fetch_all(conn, _ALL)
    ]


def record_use(conn: sa.Connection, used: Mapping[str, datetime.datetime]) -> None:
    """One statement for a batch of uses: key id -> when it was last seen."""
    if used:
        run(conn, _RECORD_USE, {"key_ids": list(used), "times": list(used.values())})


def notify_changed(conn: sa.Connection, change: str) -> None:
    """Tell every listening API process, when this transaction commits, to reload."""
    fetch_one(conn, _NOTIFY_CHANGED, {"change": change})


def count_listeners(conn: sa.Connection) -> int:
    """API processes listening for token changes on this database now."""
    return int(fetch_value(conn, _LISTENERS, {"name": LISTENER_NAME}))


class ChangeListener:
    """``LISTEN`` on ``channel`` over a dedicated autocommit connection, outside the pool.

    ``name`` sets ``application_name`` once the ``LISTEN`` took effect: a
    process is counted by :func:`count_listeners` only when it is sure to
    hear a change committed after the count. Usable in ``select`` (``fileno``).
    """

    def __init__(self, engine: sa.Engine, channel: str, *, name: str | None = None) -> None:
        self._proxy: Any = engine.raw_connection()
        try:
            connection: Any = self._proxy.driver_connection
            self._proxy.detach()  # LISTEN and autocommit must not go back to the pool
            connection.autocommit = True
            run_on_driver(connection, _LISTEN[channel])
            if name is not None:
                run_on_driver(connection, _SET_NAME, {"name": name})
        except Exception:
            self.close()
            raise
        self._connection = connection

    def fileno(self) -> int:
        return int(self._connection.fileno())

    def payloads(self) -> list[str]:
        """The notifications that arrived (read without blocking)."""
        self._connection.poll()
        payloads = [notify.payload for notify in self._connection.notifies]
        self._connection.notifies.clear()
        return payloads

    def acknowledge(self, changes: Iterable[str]) -> None:
        """Answer each change on :data:`ACK_CHANNEL`."""
        for change in changes:
            run_on_driver(self._connection, _NOTIFY_ACK, {"change": change})

    def close(self) -> None:
        self._proxy.close()
