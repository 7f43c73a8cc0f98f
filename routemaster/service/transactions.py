"""How the service opens a transaction on the store: one convention, stated here alone.

Every service function that reaches the store opens its transaction with one
of these, in a ``with`` block, so a reader sees where each begins and
ends; the store's functions run inside whatever transaction they are given
and never open one (the faces and the worker never touch the store at all).

- :func:`reading`: reads. Each statement sees what was committed when it
  began; nothing is committed. :func:`one_snapshot`: reads that must all see
  one snapshot (``REPEATABLE READ``).
- :func:`writing`: a write, committed when the block ends, rolled back if it
  raises. Never held while calling a remote server (feeds, webhooks,
  subscribers): read, call with no transaction open, then write.
- :func:`one_statement`: work that is exactly one statement, run in
  autocommit: PostgreSQL makes the statement its own transaction, and the
  ``BEGIN`` and ``COMMIT`` round trips disappear (a label read, an API
  create with nothing to evaluate).
- :func:`label_writing`: a write of one label's rows alone (an update, a
  create that evaluates): :func:`writing` on one server; on Citus a
  transaction on the node holding the label's shard
  (:func:`routemaster.db.nodes.writing_near`), so the coordinator spends on
  it only the transaction that gives its history rows their position.
- :func:`task_writing`: :func:`label_writing` for the label of a pull task,
  named by the task's id (its completion).
- :func:`one_label_write`: a write of one label with its history row (a
  create, a delete): one statement on one server, as :func:`one_statement`;
  on Citus, where the label's row and its history row are two router
  statements, a transaction as :func:`label_writing`.
- :func:`one_label_read`: a read of one label's rows that is exactly one
  statement: as :func:`one_statement`, and on Citus sent to the node holding
  the label's shard (:mod:`routemaster.db.nodes`), so the
  coordinator spends nothing on it.

A read of the store that has no rule of its own (a listing, a log, a count) is
made a service function by :func:`read`, and a write that has none by
:func:`write`: ``recent_failures = read(deliveries.recent_failures)`` opens
:func:`reading` around the store's function, which the faces then call with
the :class:`~routemaster.app.App` instead of a connection. A one-statement
read of one label's rows is made one by :func:`label_read`
(``label_read(deliveries.of_label)``), which runs it in
:func:`one_label_read`. No function is written only to open a transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa

from routemaster.app import App
from routemaster.db.keys import shard_key
from routemaster.db.nodes import near, writing_near
from routemaster.db.plumbing.database import distributed
from routemaster.db.statements import single_statement
from routemaster.db.tasks import shard_key_of_task

P = ParamSpec("P")
R = TypeVar("R")


def reading(app: App) -> AbstractContextManager[sa.Connection]:
    """A transaction for reads (rolled back at the end: it wrote nothing)."""
    return app.db.connect()


def one_snapshot(app: App) -> AbstractContextManager[sa.Connection]:
    """A transaction for reads that must all see one snapshot (``REPEATABLE READ``): a label
    and its history, the counts a stream starts from."""
    return app.db.connect().execution_options(isolation_level="REPEATABLE READ")


def writing(app: App) -> AbstractContextManager[sa.Connection]:
    """A transaction for a write: committed when the block ends, rolled back if it raises."""
    return app.db.begin()


def one_statement(app: App) -> AbstractContextManager[sa.Connection]:
    """Autocommit, for a block that runs exactly one statement (its own transaction)."""
    return single_statement(app.db)


def label_writing(app: App, name: str) -> AbstractContextManager[sa.Connection]:
    """A transaction writing label ``name``'s rows alone, as :func:`writing`; on Citus on the
    node holding them (counted in ``routemaster_label_writes``)."""
    return _writing_near(app, shard_key(name))


def task_writing(app: App, task_id: str) -> AbstractContextManager[sa.Connection]:
    """:func:`label_writing` for the label of pull task ``task_id`` (its shard key leads the
    id; an id issued before migration 0017 has none: :func:`writing`)."""
    key = shard_key_of_task(task_id)
    return writing(app) if key is None else _writing_near(app, key)


@contextmanager
def _writing_near(app: App, key: int) -> Iterator[sa.Connection]:
    if not distributed(app.db):
        with writing(app) as conn:
            yield conn
        return
    with writing_near(app.db, key) as conn:
        if app.metrics is not None:
            app.metrics.label_writes.labels(_route(app, conn)).inc()
        yield conn


def one_label_write(app: App, name: str) -> AbstractContextManager[sa.Connection]:
    """A write of label ``name`` with its history row: one statement in autocommit on one
    server; on Citus a transaction around its two router statements (one statement feeding
    the history row from the label's, a modifying CTE, is run by Citus through an
    intermediate result and commits in two phases on both workers), on the node holding
    them (:func:`label_writing`)."""
    return label_writing(app, name) if distributed(app.db) else one_statement(app)


@contextmanager
def one_label_read(app: App, name: str) -> Iterator[sa.Connection]:
    """Autocommit for one statement reading label ``name``'s rows, on the node holding them
    (counted in ``routemaster_label_reads``)."""
    with near(app.db, name) as conn:
        if app.metrics is not None:
            app.metrics.label_reads.labels(_route(app, conn)).inc()
        yield conn


def _route(app: App, conn: sa.Connection) -> str:
    """Where ``conn`` runs, as ``routemaster_label_reads`` and ``_writes`` count it."""
    return "database" if conn.engine is app.db else "node"


def read(operation: Callable[Concatenate[sa.Connection, P], R]) -> Callable[Concatenate[App, P], R]:
    """The store's read ``operation`` as a service function: called with the App, it runs in
    :func:`reading`."""

    @functools.wraps(operation)
    def in_a_read(app: App, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with reading(app) as conn:
            return operation(conn, *args, **kwargs)

    return in_a_read


def label_read(
    operation: Callable[Concatenate[sa.Connection, str, str, P], R],
) -> Callable[Concatenate[App, str, str, P], R]:
    """The store's read of one label's rows, ``operation(conn, state_machine, name, ...)`` and
    exactly one statement, as a service function: called with the App, it runs in
    :func:`one_label_read` (on Citus, on the node holding the label)."""

    @functools.wraps(operation)
    def near_the_label(
        app: App, state_machine: str, name: str, /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        with one_label_read(app, name) as conn:
            return operation(conn, state_machine, name, *args, **kwargs)

    return near_the_label


def write(
    operation: Callable[Concatenate[sa.Connection, P], R],
) -> Callable[Concatenate[App, P], R]:
    """The store's write ``operation`` as a service function: called with the App, it runs in
    :func:`writing`."""

    @functools.wraps(operation)
    def in_a_write(app: App, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with writing(app) as conn:
            return operation(conn, *args, **kwargs)

    return in_a_write
