"""Label rows and their history, read: what a label is, and the statements that read it.

A label's current state is on its row; every move also appends a history row
in the same statement, and that row's id becomes the label's ``entry_id`` (the
idempotency token of an action entry, and the "is it still where it was"
check after remote calls). Every change of what a label is (create, merge,
move, error, retry, pause, delete, upgrade) is written by
:mod:`routemaster.db.transitions`; this module reads.

Every statement naming one label names its ``shard_key`` too
(:func:`routemaster.db.keys.shard_key`), so on Citus it runs on that label's
shard alone.

**Writers of one label are serialised before they take a transaction id** (on
one server). A change's position in the changes stream begins with its
transaction's id (:mod:`routemaster.db.changes`), so two writes of one label
come out in the order they were made only if the later writer's id is the
higher. PostgreSQL gives a transaction its id at its first write, and an
``UPDATE`` takes it before it waits for the row lock; even ``FOR UPDATE``,
once the holder has updated the row, takes it before it locks the new version,
which a newcomer may lock first. So the statement with which a transaction
first reaches a label (:func:`lock`, the API's merge and delete in
:mod:`routemaster.db.transitions`, the lock of delivered labels in
:mod:`routemaster.db.label_claims`, a pull task's completion in
:mod:`routemaster.db.tasks`, a retry and a webhook given up on in
:mod:`routemaster.db.transitions`; a bulk batch's claim in :mod:`routemaster.db.bulk`
tries it without waiting) first takes a transaction-scoped advisory
lock keyed by the label, ``pg_advisory_xact_lock(hashtext(machine),
hashtext(name))``, a condition of the statement evaluated before the row lock:
it takes no transaction id and ends with the transaction (so it holds behind
a pooler in transaction mode; two labels whose keys collide only wait for each
other). Holders of it follow one another: each takes its id after
the one before committed, so its id is the higher. On Citus the coordinator
takes the id only once the worker granted the row lock, and the plain
statements are used. See "Order within one label" in docs/architecture.md.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import ONE_LABEL, RETURNED, serialised
from routemaster.db.keys import label_key, shard_key
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import Prepared, Row, fetch_all, fetch_one

LabelKey = tuple[str, str]
"""(state machine, label name)."""


@dataclass(frozen=True)
class Label:
    state_machine: str
    name: str
    metadata: dict[str, Any]
    state: str
    state_entered_at: datetime.datetime
    entry_id: int
    previous_state: str | None
    deleted: bool
    paused: bool
    errored: bool
    last_error: str | None
    attempts: int
    due_at: datetime.datetime | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    # the machine version the label follows (``continue``) or was created under (``abort``);
    # None for an ``upgrade`` machine's label: it follows the definition in force
    version: int | None

    @property
    def key(self) -> LabelKey:
        return (self.state_machine, self.name)

    @property
    def live(self) -> bool:
        return not (self.deleted or self.paused or self.errored)


def history_kind(
    recorded_kind: str | None, forced: bool, old_state: str | None, new_state: str | None
) -> str:
    """What a history row records: created, moved, deleted, forced or errored."""
    if recorded_kind is not None:
        return recorded_kind
    if forced:
        return "forced"
    if old_state is None:
        return "created"
    if new_state is None:
        return "deleted"
    return "moved"


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    old_state: str | None
    new_state: str | None
    created: datetime.datetime
    forced: bool
    reason: str | None
    recorded_kind: str | None = None  # "errored"; None: what the states and forced say

    @property
    def kind(self) -> str:
        return history_kind(self.recorded_kind, self.forced, self.old_state, self.new_state)

    version: int | None = None  # the machine version the writing process ran


@dataclass(frozen=True)
class Moves:
    """One label's moves to write: through ``states`` in order, from where it was locked."""

    label: Label
    states: tuple[str, ...]
    due_at: datetime.datetime | None  # when the worker next looks at it (an action: now)
    forced: bool = False
    reason: str | None = None
    next_check_at: datetime.datetime | None = None  # in a gate evaluated at moments (SPEC E1)


def label_from_row(row: Row) -> Label:
    """A label from a row holding the columns in :data:`LABEL_COLUMNS` order."""
    return Label(*row)


def label_params(state_machine: str, name: str) -> dict[str, Any]:
    """One label's parameters: machine, name, index and shard keys (``routemaster/db/keys.py``)."""
    return {
        "sm": state_machine,
        "name": name,
        "key": label_key(name),
        "shard_key": shard_key(name),
    }


def get(conn: sa.Connection, state_machine: str, name: str) -> Label | None:
    row = fetch_one(conn, _PREPARED_SELECT, label_params(state_machine, name))
    return None if row is None else label_from_row(row)


def lock(conn: sa.Connection, state_machine: str, name: str) -> Label | None:
    """The label, row-locked until the transaction ends (its writers serialised first)."""
    statement = _SERIALISED_SELECT_FOR_UPDATE if serialises(conn) else _SELECT_FOR_UPDATE
    row = fetch_one(conn, statement, label_params(state_machine, name))
    return None if row is None else label_from_row(row)


def is_deleted(conn: sa.Connection, state_machine: str, name: str) -> bool | None:
    """Whether the label was deleted; ``None`` when it never existed."""
    row = fetch_one(conn, _IS_DELETED, label_params(state_machine, name))
    return None if row is None else bool(row[0])


def history(conn: sa.Connection, state_machine: str, name: str) -> list[HistoryEntry]:
    rows = fetch_all(
        conn, _HISTORY, {"sm": state_machine, "name": name, "shard_key": shard_key(name)}
    )
    return [HistoryEntry(*row) for row in rows]


# One label is found through the primary key (``name_key``, ``shard_key``) and checked by its
# full name.


_SELECT = f"""
    SELECT {RETURNED}
    FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """

_SELECT_FOR_UPDATE = f"""
    SELECT {RETURNED}
    FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    FOR UPDATE
    """

_SERIALISED_SELECT_FOR_UPDATE = serialised(_SELECT_FOR_UPDATE, ONE_LABEL)
"""On one server, :data:`_SELECT_FOR_UPDATE` once the label's writers are serialised (the
module's docstring says why)."""

SERIALISED_AT_MOST = 1_000
"""The most labels one statement serialises: each advisory lock takes a slot of the server's
lock table (``max_locks_per_transaction`` per connection, 6,400 by default) until the
transaction ends; a statement over more labels runs unserialised."""


def serialises(conn: sa.Connection, labels: int = 1) -> bool:
    """Whether a statement reaching ``labels`` labels first serialises their writers: on one
    server, for at most :data:`SERIALISED_AT_MOST` (the module's docstring says why)."""
    return labels <= SERIALISED_AT_MOST and not distributed(conn)


_IS_DELETED = """
    SELECT deleted FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s
    """


# A label's history in position order: its writes are serialised, each later one's
# transaction id the higher. Ids alone are not in that order on Citus: a write routed to a
# node numbers its rows from that node's range of the sequence (routemaster/db/nodes.py).
_HISTORY = """
    SELECT id, old_state, new_state, created, forced, reason, kind, version FROM history
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND label = %(name)s
    ORDER BY xact_id, id
    """

_PREPARED_SELECT = Prepared("routemaster_label_select", _SELECT)
