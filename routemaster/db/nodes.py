"""On Citus, the node that holds each label's shard, and a pool to each: one label's reads go there.

Every request entering through the coordinator costs the coordinator more
than the whole request costs one plain PostgreSQL: it plans the statement,
opens or reuses a connection to the worker, and relays the rows. Citus 11
and later keep their metadata on every node, so a worker takes queries on
distributed tables itself, and runs locally what is local: a read of one
label sent to the node holding the label's shard costs that node alone a
little more than one plain server, and the coordinator nothing.

So a read of one label (its ``GET``, its history) goes there (:func:`near`).
The map from shard key to node is Citus's own placement, read in one
statement on the coordinator and read again every :data:`REFRESH` seconds
(the shard keys of one shard stay together; a move or rebalance changes
only which node holds them). A stale map is never wrong, only slower: a
node asked for a shard it no longer holds runs the statement as any Citus
node does, across the network to wherever the shard now is.

A write of one label goes there too (:func:`writing_near`). A history row's
position in the changes stream is the id of its transaction on the
coordinator (:mod:`routemaster.db.changes`), which a transaction started on
a worker does not have; so the write holds a transaction open on the
coordinator as well, with nothing in it but its id: the id is taken just
before the label's first history row is written (the label's row is locked,
or inserted, by an earlier statement of every one-label write, so writers of
one label take their ids in the order they write), handed to the node's
transaction as ``routemaster.xact_id`` (``routemaster_xact_id()``, migration
0022), and the coordinator's transaction commits only after the node's. So
the coordinator's horizon passes the id only once the row is visible on its
node, as with a write that went through the coordinator, and positions stay
what they were. A ``NOTIFY`` of the write is sent on the coordinator's
transaction, where the listeners are. The coordinator's part costs it a
``BEGIN``, one ``SELECT`` and a ``COMMIT``: no distributed planning, no
connection to a worker.

A node this process cannot reach (an address in ``pg_dist_node`` that only
the cluster resolves, a firewall) is found at its first connection:
its reads go through the coordinator, and the node is tried again after
:data:`RETRY_DOWN` seconds. Each node's pool is sized like the
coordinator's, and its connections carry the same transaction settings, but
send every statement as plain SQL (:func:`~routemaster.db.statements.never_prepared`).

Held in the coordinator engine's execution options (:func:`nodes_of`), like
the claims' shard map, never in a module-level variable. Plain PostgreSQL,
or ``ROUTEMASTER_ROUTE_READS=0`` (``ROUTEMASTER_ROUTE_WRITES=0``): every read
(write) goes where it always went.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.history import share_versions
from routemaster.db.keys import SHARD_KEYS, shard_key
from routemaster.db.plumbing.database import create_engine, distributed
from routemaster.db.statements import (
    COORDINATOR_OPTION,
    XACT_OPTION,
    fetch_all,
    fetch_value,
    never_prepared,
    single_statement,
)
from routemaster.db.transaction_settings import settings_of

logger = logging.getLogger(__name__)

NODES_OPTION = "routemaster_nodes"
"""The coordinator engine's execution option holding its :class:`Nodes`."""

ROUTE_OPTION = "routemaster_route_reads"
"""The coordinator engine's execution option saying whether reads are routed at all."""

ROUTE_WRITES_OPTION = "routemaster_route_writes"
"""The coordinator engine's execution option saying whether writes of one label are routed."""

REFRESH = 30.0
"""Seconds a placement read on the coordinator is used before it is read again."""

CONNECT_TIMEOUT = 2
"""Seconds a connection to a node may take before the read goes through the coordinator."""

RETRY_DOWN = 60.0
"""Seconds a node this process could not reach is left alone before it is tried again."""

SHARD_OF_KEY = """
    SELECT key, get_shard_id_for_distribution_column('labels', key)
    FROM generate_series(0, %(last)s) AS key
    """
"""Every shard key with the id of its shard of ``labels`` (every table is co-located with
labels, so the shard of the same index in each). Changes only when a shard is split."""

# Where each shard of labels is: changes when a shard is moved.
_PLACED = """
    SELECT placement.shardid, placement.groupid
    FROM pg_dist_placement AS placement JOIN pg_dist_shard AS shard USING (shardid)
    WHERE shard.logicalrelid = CAST('labels' AS regclass) AND placement.shardstate = 1
    """

# The nodes that take queries on distributed tables: active primaries with the metadata.
_NODES = """
    SELECT groupid, nodename, nodeport FROM pg_dist_node
    WHERE isactive AND noderole = 'primary' AND hasmetadata AND metadatasynced
    """

# What a node says it is, so that a pool never reads another cluster's or database's rows.
_WHO = "SELECT groupid FROM pg_dist_local_group"

# A routed write's transaction id, taken on the coordinator (its transaction stays open until
# the node's has committed) ...
_TAKE_XACT = "SELECT CAST(pg_current_xact_id() AS text)"

# ... and handed to the node's transaction, sent in front of its first history row's statement.
_GIVE_XACT = "SELECT set_config('routemaster.xact_id', %(routemaster_xact_id)s, true); "


@dataclass(frozen=True)
class NodeRoute:
    """A node as this process routes to it, for the console."""

    address: str  # host:port, as pg_dist_node names it
    shard_keys: int  # how many of the SHARD_KEYS buckets it holds
    reachable: bool | None  # None: not tried yet; False: its reads go through the coordinator


@dataclass
class _Node:
    group: int
    engine: sa.Engine
    down_until: float = 0.0


class Nodes:
    """Shard key -> the node holding it, with a pool to each node; one per coordinator engine."""

    def __init__(self, coordinator: sa.Engine) -> None:
        self._coordinator = coordinator
        self._lock = threading.Lock()
        self._shard_of: dict[int, int] = {}  # shard key -> shard id
        self._group_of: list[int] = []  # shard key -> group of the node holding it
        self._address: dict[int, tuple[str, int]] = {}
        self._nodes: dict[int, _Node] = {}
        self._read_at = float("-inf")
        self.routed = 0  # reads sent to a worker node, for /metrics
        self.fell_back = 0  # reads meant for a node that could not be reached

    def engine_for(self, key: int) -> sa.Engine:
        """The pool of the node holding shard key ``key`` (the coordinator's when it holds it,
        when the node is down for this process, or before the placement was read)."""
        self._refresh_if_old()
        with self._lock:
            group = self._group_of[key] if key < len(self._group_of) else 0
            if group == 0:
                return self._coordinator
            node = self._nodes.get(group)
            if node is not None and node.down_until <= time.monotonic():
                return node.engine
            address = self._address.get(group)
        if node is None and address is not None:
            return self._opened(group, address)
        return self._coordinator

    def routes(self) -> list[NodeRoute]:
        """Each node that holds shards, the coordinator's group first."""
        self._refresh_if_old()
        now = time.monotonic()
        with self._lock:
            held: dict[int, int] = {}
            for group in self._group_of:
                held[group] = held.get(group, 0) + 1
            routes = []
            for group in sorted(held):
                host, port = self._address.get(group, ("?", 0))
                node = self._nodes.get(group)
                reachable = True if group == 0 else None if node is None else node.down_until <= now
                routes.append(NodeRoute(f"{host}:{port}", held[group], reachable))
            return routes

    def unreachable(self, engine: sa.Engine, error: Exception, opened: _Node | None = None) -> None:
        """A connection to ``engine``'s node failed: its reads and writes go to the coordinator
        for a while (said in the log when a node that was reached stops being so)."""
        with self._lock:
            for node in [*self._nodes.values(), *([opened] if opened else [])]:
                if node.engine is engine:
                    if node.down_until <= time.monotonic():
                        logger.warning(
                            "Citus node %s:%s not reached; reads and writes of its labels go "
                            "through the coordinator for %g s: %s",
                            engine.url.host,
                            engine.url.port,
                            RETRY_DOWN,
                            str(error).splitlines()[0] if str(error) else type(error).__name__,
                        )
                    node.down_until = time.monotonic() + RETRY_DOWN
            self.fell_back += 1

    def dispose(self) -> None:
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            node.engine.dispose()

    def _refresh_if_old(self) -> None:
        if time.monotonic() - self._read_at < REFRESH:
            return
        with self._lock:  # one thread reads; the others use the map they have meanwhile
            if time.monotonic() - self._read_at < REFRESH:
                return
            self._read_at = time.monotonic()
        try:
            with self._coordinator.connect() as conn:
                placed: dict[int, int] = dict(fetch_all(conn, _PLACED, {}))
                if not self._shard_of or not placed.keys() <= set(self._shard_of.values()):
                    self._shard_of = dict(fetch_all(conn, SHARD_OF_KEY, {"last": SHARD_KEYS - 1}))
                nodes = fetch_all(conn, _NODES, {})
        except sa.exc.DBAPIError:
            with self._lock:  # the coordinator is away: keep the map, read it again soon
                self._read_at = time.monotonic() - REFRESH + RETRY_DOWN / 10
            return
        group_of = [placed.get(self._shard_of.get(key, -1), 0) for key in range(SHARD_KEYS)]
        with self._lock:
            self._group_of = group_of
            self._address = {group: (host, port) for group, host, port in nodes}

    def _opened(self, group: int, address: tuple[str, int]) -> sa.Engine:
        """A pool to the node of ``group``, checked to be that node of this cluster's database."""
        url = self._coordinator.url.set(host=address[0], port=address[1])
        if "connect_timeout" not in url.query:  # a node behind a firewall that drops: 2 s, once
            url = url.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT)})
        pool = self._coordinator.pool
        engine = create_engine(
            url.render_as_string(hide_password=False),
            pool_size=pool.size() if isinstance(pool, sa.pool.QueuePool) else 5,
            max_overflow=4,
        )
        never_prepared(engine)
        share_versions(self._coordinator, engine)
        coordinator_settings = settings_of(self._coordinator)
        settings = settings_of(engine)
        settings.statement_timeout_ms = coordinator_settings.statement_timeout_ms
        node = _Node(group, engine)
        try:
            with engine.connect() as conn:
                if fetch_value(conn, _WHO) != group or not distributed(conn):
                    node.down_until = float("inf")  # another cluster or database: never used
        except sa.exc.DBAPIError as error:
            self.unreachable(engine, error, node)
        with self._lock:
            kept = self._nodes.setdefault(group, node)
        if kept is not node:
            engine.dispose()
        return kept.engine if kept.down_until <= time.monotonic() else self._coordinator


def nodes_of(engine: sa.Engine, *, option: str = ROUTE_OPTION) -> Nodes | None:
    """The coordinator engine's :class:`Nodes` on Citus with routing on (reads, or what
    ``option`` names); ``None`` otherwise."""
    options = engine.get_execution_options()
    if options.get(option) is False:
        return None
    found = options.get(NODES_OPTION)
    if isinstance(found, Nodes):
        return found
    if not distributed(engine):
        return None
    made = Nodes(engine)
    engine.update_execution_options(**{NODES_OPTION: made})
    return made


def dispose_nodes(engine: sa.Engine) -> None:
    """Close the pools to the nodes that ``engine``'s reads were routed to, if any were opened
    (``engine.dispose()`` closes only its own)."""
    found = engine.get_execution_options().get(NODES_OPTION)
    if isinstance(found, Nodes):
        found.dispose()


def route_reads(engine: sa.Engine, *, on: bool) -> None:
    """Whether ``engine``'s reads of one label may go to the node holding it (default: yes)."""
    engine.update_execution_options(**{ROUTE_OPTION: on})


def route_writes(engine: sa.Engine, *, on: bool) -> None:
    """Whether ``engine``'s writes of one label may go to the node holding it (default: yes)."""
    engine.update_execution_options(**{ROUTE_WRITES_OPTION: on})


class _CoordinatorXact:
    """A routed write's transaction on the coordinator: opened when its id is first wanted."""

    def __init__(self, coordinator: sa.Connection) -> None:
        self.coordinator = coordinator
        self.given = False

    def prefix(self, sql: str) -> tuple[str, dict[str, str]] | None:
        """What to send in front of ``sql`` on the node, with its parameters: the id, before
        the first history row (``routemaster_xact_id()``), taken now; nothing (``None``)
        before or after that."""
        if self.given or "routemaster_xact_id()" not in sql:
            return None
        xact = str(int(fetch_value(self.coordinator, _TAKE_XACT)))
        self.given = True
        return _GIVE_XACT, {"routemaster_xact_id": xact}


@contextmanager
def writing_near(engine: sa.Engine, key: int) -> Iterator[sa.Connection]:
    """A transaction writing one label's rows alone, on the node holding its shard key ``key``.

    Committed when the block ends, rolled back if it raises, as
    ``engine.begin()`` (which it is on plain PostgreSQL, with routing off, or
    where the node cannot be reached). On a node, the coordinator's
    transaction that gives the history rows their id (the module's
    docstring) commits after the node's, and takes the write's ``NOTIFY``
    (:data:`~routemaster.db.statements.COORDINATOR_OPTION`). Every statement
    in the block must reach that label's rows alone (its tasks, deliveries,
    children's rows: its shard), and lock or insert the label's row before
    its first history row.
    """
    nodes = nodes_of(engine, option=ROUTE_WRITES_OPTION)
    target = engine if nodes is None else nodes.engine_for(key)
    node_conn = None
    if nodes is not None and target is not engine:
        try:
            node_conn = target.connect()
        except sa.exc.DBAPIError as error:
            nodes.unreachable(target, error)
    if node_conn is None:
        with engine.begin() as conn:
            yield conn
        return
    assert nodes is not None
    with node_conn, engine.connect() as coordinator:
        coordinator.begin()  # sends nothing: PostgreSQL's transaction begins with its first use
        xact = _CoordinatorXact(coordinator)
        node_conn.execution_options(**{XACT_OPTION: xact, COORDINATOR_OPTION: coordinator})
        try:
            with node_conn.begin():
                yield node_conn
        except sa.exc.DBAPIError as error:
            if error.connection_invalidated:
                nodes.unreachable(target, error)
            raise
        # The node has committed: its rows are visible before the id's transaction ends.
        try:
            coordinator.commit()
        except sa.exc.DBAPIError as error:  # the write stands; only its wake-up is lost
            logger.warning("a write's transaction on the coordinator did not commit: %s", error)


@contextmanager
def near(engine: sa.Engine, name: str) -> Iterator[sa.Connection]:
    """Autocommit on the node holding label ``name``'s shard, for exactly one read statement.

    On plain PostgreSQL, or where that node cannot be reached, the coordinator's
    :func:`~routemaster.db.statements.single_statement`. A node that refuses the
    connection costs nothing but the attempt (the read goes to the coordinator); one
    lost during the statement fails it like an outage, and the next reads go to the
    coordinator.
    """
    nodes = nodes_of(engine)
    target = engine if nodes is None else nodes.engine_for(shard_key(name))
    with ExitStack() as stack:
        conn = None
        if nodes is not None and target is not engine:
            try:
                conn = stack.enter_context(single_statement(target))
            except sa.exc.DBAPIError as error:
                nodes.unreachable(target, error)
            else:
                nodes.routed += 1
        if conn is None:
            target = engine
            conn = stack.enter_context(single_statement(engine))
        try:
            yield conn
        except sa.exc.DBAPIError as error:
            if nodes is not None and target is not engine and error.connection_invalidated:
                nodes.unreachable(target, error)
            raise
