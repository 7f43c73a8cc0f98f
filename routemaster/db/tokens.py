"""API tokens: their rows, the ``NOTIFY`` that tells API processes of a change, and its answers.

Only a hash of each secret is stored. API processes keep every token in
memory and ``LISTEN`` on :data:`CHANGED_CHANNEL` where that works
(:func:`change_listener`, checked as :mod:`routemaster.db.notifications`
says); a command that creates or revokes a token notifies that channel in
the same transaction, and each listening process answers on
:data:`ACK_CHANNEL` once it has reloaded, so the command can tell when
every running process has the change. A process reads one token by its key
id (:func:`token_by_key_id`) when a secret it does not know is used.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.notifications import Listener
from routemaster.db.statements import fetch_all, fetch_one, fetch_value, run

CHANGED_CHANNEL = "routemaster_tokens"
ACK_CHANNEL = "routemaster_tokens_ack"
ACK_CHECK_WITHIN = 1.0  # seconds ``routemaster token`` waits to see that notifications arrive
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

_ONE = """
    SELECT name, key_id, secret_hash, scopes, created_at, last_used_at
    FROM api_tokens WHERE key_id = %(key_id)s
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
    return [_stored(*row) for row in fetch_all(conn, _ALL)]


def token_by_key_id(conn: sa.Connection, key_id: str) -> StoredToken | None:
    """The token whose secret carries ``key_id``, if there is one (a unique index finds it)."""
    row = fetch_one(conn, _ONE, {"key_id": key_id})
    return None if row is None else _stored(*row)


def _stored(
    name: str,
    key_id: str,
    secret_hash: str,
    scopes: list[str],
    created_at: datetime.datetime,
    last_used_at: datetime.datetime | None,
) -> StoredToken:
    return StoredToken(
        name=name,
        key_id=key_id,
        secret_hash=secret_hash,
        scopes=frozenset(scopes),
        created_at=created_at,
        last_used_at=last_used_at,
    )


def record_use(conn: sa.Connection, used: Mapping[str, datetime.datetime]) -> None:
    """One statement for a batch of uses: key id -> when it was last seen."""
    if used:
        run(conn, _RECORD_USE, {"key_ids": list(used), "times": list(used.values())})


def notify_changed(conn: sa.Connection, change: str) -> None:
    """Tell every listening API process, when this transaction commits, to reload."""
    fetch_one(conn, _NOTIFY_CHANGED, {"change": change})


def change_listener(
    listen_on: sa.Engine,
    notify_through: sa.Engine,
    on_change: Callable[[bool], None] | None = None,
) -> Listener:
    """An API process's listener for token changes, named so :func:`count_listeners` counts
    it once (and only once) the check has shown that it hears notifications."""
    return Listener(
        listen_on,
        notify_through,
        [(_LISTEN[CHANGED_CHANNEL], {}), (_SET_NAME, {"name": LISTENER_NAME})],
        what="token changes",
        on_change=on_change,
    )


def ack_listener(listen_on: sa.Engine, notify_through: sa.Engine) -> Listener:
    """What ``routemaster token`` hears the API processes' acknowledgements on."""
    return Listener(
        listen_on,
        notify_through,
        [(_LISTEN[ACK_CHANNEL], {})],
        what="token acknowledgements",
        check_within=ACK_CHECK_WITHIN,
    )


def acknowledge(listener: Listener, changes: Iterable[str]) -> None:
    """Answer each change on :data:`ACK_CHANNEL`, on the listening connection."""
    for change in changes:
        listener.run(_NOTIFY_ACK, {"change": change})


def count_listeners(conn: sa.Connection) -> int:
    """API processes listening for token changes on this database now."""
    return int(fetch_value(conn, _LISTENERS, {"name": LISTENER_NAME}))
