"""Work that spans labels, on Citus: which shard each shard key is in, and going shard by shard.

On plain PostgreSQL a claim is one statement that picks due rows with
``FOR UPDATE SKIP LOCKED``. Citus refuses row locks in a statement that
reaches several shards, and ``SKIP LOCKED`` only means something inside
one shard. So every claim (due gates, deliveries by receiver, pull tasks,
run-out leases, labels given up on, retention's batches, bulk items) is one
statement that takes an optional ``%(shard_keys)s``: ``NULL`` on one server
(the filter folds away when PostgreSQL plans it), and on Citus every shard
key of one shard, which makes it a **router statement** (one shard in its
plan) where ``FOR UPDATE SKIP LOCKED`` holds as on one server. On Citus a
claim is then:

1. the shards that the last read across the shards found, if it ran less
   than :data:`HINT_SECONDS` ago, less those a claim has found empty since:
   their statements alone, no read across the shards while they fill the
   claim (a busy worker reads across the shards about once a second, not
   at every round);
2. otherwise (or to take the rest) a **non-locking read across the shards**
   of the shard keys of the oldest due rows (``ORDER BY ... LIMIT``: each
   shard answers from its own index and the coordinator merges), and the
   statement on each shard holding one of them, from a random one on.

Each shard's statement is asked for what the earlier shards left, until the
claim has what it asked for, and runs on all of its shard's keys, so a shard
with a deep backlog fills a claim alone. That take is written once,
:func:`take_each`; :func:`take` is its common case (one statement, each shard
asked for fewer rows). Among its users: the claims of labels
(:mod:`routemaster.db.label_claims`).

Which shard a key is in is Citus's placement, read once per engine (one
statement, :meth:`ShardMap.groups`) and kept in the engine's execution
options (:func:`shard_map`), never in a module-level variable. It is only
an optimisation: Citus routes each statement by the values it names, so a
stale map (a shard split since) can make a group span two shards, which
Citus then refuses (row locks across shards) instead of doing anything
wrong; the failure drops the map (:meth:`ShardMap.run`), the round is
retried by its caller, and the next use reads the placement again.

Visiting the shards from a random one on lets many ``cron`` processes
claiming at once start on different shards and share the work instead of
queueing on the same rows (``SKIP LOCKED`` lets each pass over what another
holds). The shards found are visited first for at most :data:`HINT_SECONDS`:
older work on another shard waits at most that long behind them.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import sqlalchemy as sa

from routemaster.db.idle_shards import IdleShards
from routemaster.db.keys import SHARD_KEYS
from routemaster.db.nodes import SHARD_OF_KEY
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import Params, Row, Statement, fetch_all, run

_T = TypeVar("_T")

Fetch = Callable[[sa.Connection, Statement, Params], list[Row]]
"""How a claim statement is run: :func:`~routemaster.db.statements.fetch_all`, or on Citus
:meth:`ShardMap.fetch_all` (which drops a stale placement on failure)."""

SHARDS_OPTION = "routemaster_shards"
"""The engine execution option holding its :class:`ShardMap`."""

HINT_SECONDS = 1.0
"""How long the shards a read across the shards found are visited without reading again."""

FIND_KEYS = 32
"""The fewest keys a claim of pull tasks or deliveries asks its read across the shards for
(``%(find_keys)s``), however few labels it claims: the shards they are in are the hints that
the claims of the next :data:`HINT_SECONDS` visit without reading again. A read of as many
keys as the claim wanted found one shard for a pull claim of one task, so the next claim read
again as soon as that shard ran dry (measured by ``bench/statements.py``: 2.4 statements per
worker per pull task, each a shard's read); the read costs a shard no more for a few more rows
of its index."""


class ShardMap:
    """Shard key -> shard id, as Citus placed them when last read; one per engine.

    Also, per claim (its read across the shards), the shards that read found, less those
    a claim has found empty since.
    """

    def __init__(self) -> None:
        self._shard_of: dict[int, int] | None = None
        self._keys_of: dict[int, list[int]] = {}
        self._with_work: dict[Statement, tuple[list[int], float]] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()
        self.idle = IdleShards()

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
        return self._from_random(groups)

    def shards_with_work(
        self, conn: sa.Connection, find: Statement, params: Params, *, quiet: bool = False
    ) -> Iterator[list[int]]:
        """Every shard key of each shard that may hold ``find``'s rows, one shard at a time.

        First the shards the last read across the shards found (less than
        :data:`HINT_SECONDS` ago) and no claim has found empty since; then, only if
        the caller asks for more, the shards of ``find``'s keys (a new read across
        the shards), from a random one on. Tell :meth:`answered` how each did.
        ``quiet``: the read is skipped while :attr:`idle` says it would find nothing.
        """
        if quiet and self.idle.quiet(find, params.get("now")):
            return
        shard_of = self._placement(conn)
        visited: list[int] = []  # each shard once: a second visit would take the rows this
        for shard in self._known(find):  # transaction locked there again (its own locks)
            visited.append(shard)
            yield self._keys_of[shard]
        keys = fetch_all(conn, find, params)
        if quiet:
            self.idle.found(find, params.get("now"), rows=len(keys))
        found = {shard_of[key] for (key,) in keys}
        fresh = self._from_random(sorted(found - set(visited)))
        with self._lock:
            still = set(self._with_work.get(find, ([], 0.0))[0])  # visited, not found empty
            kept = [shard for shard in visited if shard in still and shard in found]
            self._with_work[find] = (kept + fresh, time.monotonic() + HINT_SECONDS)
        for shard in fresh:
            yield self._keys_of[shard]

    def answered(self, find: Statement, group: list[int], *, full: bool) -> None:
        """A shard's claim took all it was asked for (``full``: it may hold more) or not
        (it has no more: later claims skip it until the next read across the shards)."""
        shard = (self._shard_of or {}).get(group[0]) if group else None
        if shard is None or full:
            return
        with self._lock:
            known, until = self._with_work.get(find, ([], 0.0))
            if shard in known:
                self._with_work[find] = ([other for other in known if other != shard], until)

    def whole_shards(self, conn: sa.Connection, keys: Iterable[int]) -> list[list[int]]:
        """Every shard key of each shard holding one of ``keys``, from a random shard on."""
        shard_of = self._placement(conn)
        shards = sorted({shard_of[key] for key in keys})
        return [self._keys_of[shard] for shard in self._from_random(shards)]

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
            self._keys_of = {}
            self._with_work.clear()

    def _known(self, find: Statement) -> list[int]:
        with self._lock:
            known, until = self._with_work.get(find, ([], 0.0))
            if until <= time.monotonic():
                return []
            return [shard for shard in dict.fromkeys(known) if shard in self._keys_of]

    def _from_random(self, items: list[_T]) -> list[_T]:
        if not items:
            return items
        with self._lock:
            start = self._rng.randrange(len(items))
        return items[start:] + items[:start]

    def _placement(self, conn: sa.Connection) -> dict[int, int]:
        with self._lock:
            known = self._shard_of
        if known is not None:
            return known
        rows = fetch_all(conn, SHARD_OF_KEY, {"last": SHARD_KEYS - 1})
        placement = {int(key): int(shard) for key, shard in rows}
        keys_of: dict[int, list[int]] = {}
        for key in sorted(placement):
            keys_of.setdefault(placement[key], []).append(key)
        with self._lock:
            self._shard_of = placement
            self._keys_of = keys_of
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


def known_shard_map(engine: sa.Engine) -> ShardMap | None:
    """The engine's :class:`ShardMap` if one was made (Citus), without a statement."""
    found = engine.get_execution_options().get(SHARDS_OPTION)
    return found if isinstance(found, ShardMap) else None


def take(
    conn: sa.Connection,
    find: Statement,
    claim: Statement,
    params: Params,
    *,
    limit: str = "limit",
    quiet: bool = False,
) -> list[Row]:
    """Up to ``params[limit]`` rows of the claim ``claim``: on one server one statement, its
    ``%(shard_keys)s`` NULL (every row); on Citus shard by shard (:func:`take_each`), each
    shard's statement asked, under the name ``limit``, for what the earlier shards left."""
    wanted = int(params[limit])

    def claim_in(fetch: Fetch, shard_keys: list[int] | None, taken: list[Row]) -> list[Row]:
        return fetch(conn, claim, {**params, limit: wanted - len(taken), "shard_keys": shard_keys})

    return take_each(conn, find, params, claim_in, wanted=wanted, quiet=quiet)


def take_each(
    conn: sa.Connection,
    find: Statement,
    params: Params,
    claim: Callable[[Fetch, list[int] | None, list[_T]], list[_T]],
    *,
    wanted: int,
    groups: Callable[[ShardMap], Iterable[list[int]]] | None = None,
    more: Callable[[list[_T]], bool] | None = None,
    quiet: bool = False,
) -> list[_T]:
    """Up to ``wanted`` items of ``claim(fetch, shard_keys, taken)``, the one shard-by-shard take.

    ``claim`` runs one claim statement through ``fetch`` with ``%(shard_keys)s`` set to
    ``shard_keys`` and asks for what is still wanted after ``taken``. On one server it
    runs once (``shard_keys`` NULL, nothing taken). On Citus it runs on each shard
    :meth:`ShardMap.shards_with_work` finds for ``find`` (or ``groups``, when the caller
    chooses the shards) until ``wanted`` are taken or ``more(taken)`` is false.
    ``quiet``: a claim of a worker's round, whose reads across the shards
    :mod:`~routemaster.db.idle_shards` may skip while nothing is due.
    """
    shards = shard_map(conn)
    if shards is None:
        return claim(fetch_all, None, [])
    if groups is None:
        found: Iterable[list[int]] = shards.shards_with_work(conn, find, params, quiet=quiet)
    elif quiet and shards.idle.quiet(find, params.get("now")):
        return []
    else:
        found = groups(shards)
    taken: list[_T] = []
    for group in found:
        asked = wanted - len(taken)
        rows = claim(shards.fetch_all, group, taken)
        shards.answered(find, group, full=len(rows) >= asked)
        taken += rows
        if len(taken) >= wanted or (more is not None and not more(taken)):
            break
    return taken
