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


_INSERT = sa.text(
    """
    INSERT INTO api_tokens (name, key_id, secret_hash, scopes)
    VALUES (:name, :key_id, :secret_hash, :scopes)
    ON CONFLICT (name) DO NOTHING
    """
)

_DELETE = sa.text("DELETE FROM api_tokens WHERE name = :name")

_ALL = sa.text(
    """
    SELECT name, key_id, secret_hash, scopes, created_at, last_used_at
    FROM api_tokens ORDER BY name
    """
)

_RECORD_USE = sa.text(
    """
    UPDATE api_tokens SET last_used_at = greatest(last_used_at, used.at)
    FROM (SELECT unnest(CAST(:key_ids AS text[])) AS key_id,
                 unnest(CAST(:times AS timestamptz[])) AS at) AS used
    WHERE api_tokens.key_id = used.key_id
    """
)

_NOTIFY_CHANGED = sa.text(f"SELECT pg_notify('{CHANGED_CHANNEL}', :change)")

_NOTIFY_ACK = f"SELECT pg_notify('{ACK_CHANNEL}', %s)"

_LISTENERS = sa.text(
    """
    SELECT count(*) FROM pg_stat_activity
    WHERE application_name = :name AND datname = current_database()
    """
)


def insert_token(
    conn: sa.Connection, *, name: str, key_id: str, secret_hash: str, scopes: Iterable[str]
) -> None:
    """Store a new token; :class:`TokenExists` when the name is taken."""
    inserted = conn.execute(
        _INSERT,
        {"name": name, "key_id": key_id, "secret_hash": secret_hash, "scopes": sorted(scopes)},
    )
    if inserted.rowcount == 0:
        raise TokenExists(name)


def delete_token(conn: sa.Connection, name: str) -> bool:
    """Forget the token called ``name``; whether there was one."""
    return conn.execute(_DELETE, {"name": name}).rowcount > 0


def all_tokens(conn: sa.Connection) -> list[StoredToken]:
    return [
        StoredToken(
            name=row.name,
            key_id=row.key_id,
            secret_hash=row.secret_hash,
            scopes=frozenset(row.scopes),
            created_at=row.created_at,
            last_used_at=row.last_used_at,
        )
        for row in conn.execute(_ALL)
    ]


def record_use(conn: sa.Connection, used: Mapping[str, datetime.datetime]) -> None:
    """One statement for a batch of uses: key id -> when it was last seen."""
    if used:
        conn.execute(_RECORD_USE, {"key_ids": list(used), "times": list(used.values())})


def notify_changed(conn: sa.Connection, change: str) -> None:
    """Tell every listening API process, when this transaction commits, to reload."""
    conn.execute(_NOTIFY_CHANGED, {"change": change})


def count_listeners(conn: sa.Connection) -> int:
    """API processes listening for token changes on this database now."""
    return int(conn.execute(_LISTENERS, {"name": LISTENER_NAME}).scalar_one())


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
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {channel}")
                if name is not None:
                    cursor.execute("SET application_name = %s", (name,))
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
        with self._connection.cursor() as cursor:
            for change in changes:
                cursor.execute(_NOTIFY_ACK, (change,))

    def close(self) -> None:
        self._proxy.close()
