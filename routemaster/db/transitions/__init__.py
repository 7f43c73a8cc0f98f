"""Label transitions: every change of what a label is, each one function, with its history row.

One module a kind of transition: :mod:`.creation` (create, merge metadata), :mod:`.moves`,
:mod:`.errors` (error, retry, pause and resume), :mod:`.deletion` (delete, purge),
:mod:`.versions` (upgrade, rename), :mod:`.completion` (a pull task completed),
:mod:`.children` (a spawn's children created, SPEC G3) and
:mod:`.entries` (history rows with no change of state); every name is importable from here.

A label is created, has its metadata merged (by an update, or by a pull
task's completion), moves, becomes errored, is retried, paused and resumed,
deleted (by the API, a bulk command or retention), removed with its history
(retention's purge), and put on another version of its machine (a
configuration's rename, an upgrade) here and nowhere else: each transition is
one function of this package, which every path to it calls (the API, the
worker, operator and bulk commands, receivers' upkeep, retention,
configuration migrations). Writes that only keep a label's due time
(:mod:`routemaster.db.schedules`) or its lease (:mod:`routemaster.db.label_claims`,
``db/tasks.py``) are not transitions and live with the queue they serve;
``tests/db/test_transitions.py`` checks that no statement elsewhere creates,
deletes or changes what a label is, or writes history.

**History is appended here alone.** A transition that creates, moves or
deletes a label writes its history row in the same statement as the label's
row (one round trip, and the kept counts of :mod:`routemaster.db.label_counts`,
folded from history, never miss a change); a history row that goes with no
change of state (an operator's forced entry, an error, a retry, a pause) is
appended by :func:`append` or :func:`append_one`. Every one names the row's
shard key, version and transaction as :mod:`routemaster.db.history` says
(``tests/db/test_history_writers.py`` checks).

**Keyed by the label.** Every statement naming one label names its
``shard_key`` (:func:`routemaster.db.keys.shard_key`), and a batch names its
labels' (``= ANY(...)``), so on Citus it runs on those shards alone, and
passes the time as a parameter (Citus refuses ``now()`` in a ``CASE`` and in
the UPDATE of a distributed table). On Citus a statement that feeds history
from the label's row through a modifying CTE is run through an intermediate
result and commits in two phases on both workers: there a create, a delete
and an error are two router statements instead, the label's row then its
history row, in the caller's transaction (the service opens it:
:func:`routemaster.service.transactions.one_label_write`); each such twin
sits next to the statement it stands for.

Statements are written and run as :mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

from routemaster.db.transitions.children import create_children
from routemaster.db.transitions.completion import complete_tasks
from routemaster.db.transitions.creation import insert, merge_metadata
from routemaster.db.transitions.deletion import (
    FINISHED_REASON,
    delete_finished,
    purge_deleted,
    soft_delete,
)
from routemaster.db.transitions.entries import append, append_one, record_forced
from routemaster.db.transitions.errors import (
    Erring,
    become_errored,
    mark_errored,
    pause,
    retry,
)
from routemaster.db.transitions.moves import write_moves
from routemaster.db.transitions.versions import rename, rename_batch, set_version

__all__ = [
    "FINISHED_REASON",
    "Erring",
    "append",
    "append_one",
    "become_errored",
    "complete_tasks",
    "create_children",
    "delete_finished",
    "insert",
    "mark_errored",
    "merge_metadata",
    "pause",
    "purge_deleted",
    "record_forced",
    "rename",
    "rename_batch",
    "retry",
    "set_version",
    "soft_delete",
    "write_moves",
]
