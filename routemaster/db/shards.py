"""Work that spans labels, on Citus: which shard each shard key is in, and going shard by shard.

On plain PostgreSQL a claim is one statement that picks due rows with
``FOR UPDATE SKIP LOCKED``. Citus refuses row locks in a statement that
reaches several shards, and ``SKIP LOCKED`` only means something inside
one shard. So on Citus every claim (due gates, deliveries by receiver, pull
tasks, run-out leases, labels given up on, retention's batches, bulk items)
is the same work in two steps, written as two complete statements beside
the plain one in the module of the rows it touches:

1. a **non-locking read across the shards** finds the shard keys that have
   such work (the keys of the oldest due rows, ``ORDER BY ... LIMIT``: each
   shard answers from its own index and the coordinator merges);
2. per shard, a **router statement** (one shard in its plan) does the plain
   statement's work restricted to ``shard_key = ANY(%(shard_keys)s)``, the
   found keys of that shard, with ``FOR UPDATE SKIP LOCKED`` as on one server,
   until the claim has what it asked for.

Which shard a key is in is Citus's placement, read once per engine (one
statement, :func:`ShardMap.groups`) and kept in the engine's execution
options (:func:`shard_map`), never in a module-level variable. It is only
an optimisation: Citus routes each statement by the values it names, so a
stale map (a shard split since) can make a group span two shards, which
Citus then refuses (row locks across shards) instead of doing anything
wrong; the failure drops the map (:meth:`ShardMap.run`), the round is
retried by its caller, and the next use reads the placement again.

Each caller visits the shards from a random one on, so many ``cron``
processes claiming at once start on different shards and share the work
instead of queueing on the same rows (``SKIP LOCKED`` lets each pass over
what another holds).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable

import sqlalchemy as sa

from routemaster.db.keys import SHARD_KEYS
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import Params, Row, Statement, fetch_all, run

SHARDS_OPTION = "routemaster_shards"
"""The engine execution option holding its :class:`ShardMap`."""

# Every shard key with the id of the shard of ``labels`` it is in (all tables are co-located
# with labels, so it is each table's shard too, by index).
_PLACEMENT = """
    SELECT key, get_shard_id_for_distribution_column('labels', key)
    FROM generate_series(0, %(last)s) AS key
    """


class ShardMap:
    """Shard key -> shard id, as Citus placed them when last read; one per engine."""

    def __init__(self) -> None:
        self._shard_of: dict[int, int] | None = None
        self._lock = threading.Lock()
        self._rng = random.Random()

    def groups(
        self, conn: sa.Connection, keys: Iterable[int], *, ordered: bool = False
    ) -> list[list[int]]:
        """``keys`` grouped by shard, each group sorted, starting at a random group.

        ``ordered``: in shard order instead, for statements that wait for row locks
        (every transaction then takes its shards' locks in one order, as one server's
        statements take rows in key order).
        """
        shard_of = self._placement(conn)
        by_shard: dict[int, set[int]] = {}
        for key in keys:
            by_shard.setdefault(shard_of[key], set()).add(key)
        groups = [sorted(by_shard[shard]) for shard in sorted(by_shard)]
        if not groups or ordered:
            return groups
        with self._lock:
            start = self._rng.randrange(len(groups))
        return groups[start:] + groups[:start]

    def take(
        self,
        conn: sa.Connection,
        find: Statement,
        take: Statement,
        params: Params,
        *,
        limit: str = "limit",
    ) -> list[Row]:
        """Up to ``params[limit]`` rows: ``find``'s shard keys, then ``take`` shard by shard.

        ``find`` is the non-locking read across the shards (it returns shard
        keys); ``take`` the router statement, given ``%(shard_keys)s`` and,
        under the name ``limit``, what the earlier shards left to take.
        """
        wanted = int(params[limit])
        keys = [key for (key,) in fetch_all(conn, find, params)]
        rows: list[Row] = []
        for group in self.groups(conn, keys):
            rows += self.fetch_all(
                conn, take, {**params, limit: wanted - len(rows), "shard_keys": group}
            )
            if len(rows) >= wanted:
                break
        return rows

    def fetch_all(self, conn: sa.Connection, statement: Statement, params: Params) -> list[Row]:
        """A router statement's rows; on failure the placement is read again next time."""
        try:
            return fetch_all(conn, statement, params)
        except sa.exc.DBAPIError:
            self.forget()
            raise

    def run(self, conn: sa.Connection, statement: Statement, params: Params) -> int:
        """A router statement run for its effect (as :meth:`fetch_all`)."""
        try:
            return run(conn, statement, params)
        except sa.exc.DBAPIError:
            self.forget()
            raise

    def forget(self) -> None:
        """Read the placement again at the next use (a shard may have been split)."""
        with self._lock:
            self._shard_of = None

    def _placement(self, conn: sa.Connection) -> dict[int, int]:
        with self._lock:
            known = self._shard_of
        if known is not None:
            return known
        rows = fetch_all(conn, _PLACEMENT, {"last": SHARD_KEYS - 1})
        placement = {int(key): int(shard) for key, shard in rows}
        with self._lock:
            self._shard_of = placement
        return placement


def one_connection_per_node(conn: sa.Connection) -> None:
    """Make this transaction's statements across shards use one connection per node.

    A transaction that touches many shards in parallel (several connections to
    a node) and then writes a reference table (``bulk_jobs``,
    ``retention_horizons``) is refused by Citus; run first in such a
    transaction, this makes its multi-shard statements go over one connection
    per node, which the reference table's write can then use. Transaction-local
    (``set_config(..., true)``), so it holds behind a transaction-mode pooler.
    """
    run(conn, _ONE_CONNECTION_PER_NODE)


_ONE_CONNECTION_PER_NODE = "SELECT set_config('citus.multi_shard_modify_mode', 'sequential', true)"


def shard_map(conn: sa.Connection) -> ShardMap | None:
    """The engine's :class:`ShardMap` on Citus; ``None`` on plain PostgreSQL (one statement)."""
    engine = conn.engine
    if not distributed(conn):
        return None
    found = engine.get_execution_options().get(SHARDS_OPTION)
    if isinstance(found, ShardMap):
        return found
    made = ShardMap()
    engine.update_execution_options(**{SHARDS_OPTION: made})
    return made
