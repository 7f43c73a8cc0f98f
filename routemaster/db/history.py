"""What a history row carries: its shard key, its version and its transaction, always named.

History is appended in one module, :mod:`routemaster.db.transitions`, by the
transition that writes the row (a move, a create, a delete, an error, a
forced entry, a rename); this module says what every such row names and
gives the versions it carries. Every one names the same columns, so a row is complete however
it was written and wherever it lands (on Citus, on the label's shard):

- ``shard_key``: the label's (:func:`routemaster.db.keys.shard_key`);
- ``version``: the version the label follows when its machine keeps labels on
  their own version (``upgrade_strategy: continue``) and the label has one,
  else the version of its machine the writing process runs (NULL when it
  records none). A trigger did this until migration 0017; on Citus a trigger
  runs on the worker's shard, where the coordinator's session settings are not
  visible. The statements write it as
  ``CASE WHEN %(continuing)s THEN COALESCE(labels.version, %(running)s) ELSE
  %(running)s END`` with :func:`version_params` (a batch names each row's, :func:`version_for`);
- ``xact_id``: ``routemaster_xact_id()`` named in the statement (migration 0022):
  ``pg_current_xact_id()``, unless a write sent to the Citus node holding the
  label (:func:`routemaster.db.nodes.writing_near`) set ``routemaster.xact_id``
  to the id of the transaction it holds open on the coordinator. On one server
  that is what the column's default gives; through the coordinator on Citus
  the function is volatile, so the coordinator evaluates it (an ``INSERT ...
  SELECT`` naming it is pulled to the coordinator instead of being pushed down
  to a worker, where it would take the worker's transaction id): either way
  the changes stream orders by the coordinator's transaction.

``transitions.append`` writes rows that go with no change to the label row (an
operator's forced entry); the statements that move a label write their row
in the same statement as the label's change (one round trip), with the same
columns; ``tests/db/test_history_writers.py`` checks that every writer names them.

The versions a process runs are kept per engine (:func:`stamp_versions`), in
its execution options, which every connection of the engine reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

__all__ = [
    "Entry",
    "RunningVersions",
    "running_versions",
    "share_versions",
    "stamp_versions",
    "version_for",
    "version_params",
]

_VERSIONS_OPTION = "routemaster_running_versions"


@dataclass
class RunningVersions:
    """Per machine, the version this process runs; the machines whose labels keep their own."""

    versions: dict[str, int] = field(default_factory=dict)
    continuing: frozenset[str] = frozenset()

    def of(self, machine: str) -> tuple[int | None, bool]:
        """(the running version, whether the label's own version comes first)."""
        return self.versions.get(machine), machine in self.continuing


def running_versions(engine_or_conn: sa.Engine | sa.Connection) -> RunningVersions:
    """The engine's running versions (empty until :func:`stamp_versions`), made on first use."""
    found = engine_or_conn.get_execution_options().get(_VERSIONS_OPTION)
    if isinstance(found, RunningVersions):
        return found
    engine = engine_or_conn if isinstance(engine_or_conn, sa.Engine) else engine_or_conn.engine
    running = RunningVersions()
    engine.update_execution_options(**{_VERSIONS_OPTION: running})
    return running


def stamp_versions(
    engine: sa.Engine, versions: Mapping[str, int], continuing: Iterable[str] = ()
) -> None:
    """History rows written through ``engine`` from now on carry ``versions`` (machine: version).

    ``continuing``: the machines whose rows carry the label's own version instead (SPEC E4).
    """
    running = running_versions(engine)
    running.versions = dict(versions)
    running.continuing = frozenset(continuing)


def share_versions(source: sa.Engine, target: sa.Engine) -> None:
    """History rows written through ``target`` (a pool to a Citus node, for routed writes)
    carry ``source``'s running versions, now and after every later :func:`stamp_versions`."""
    target.update_execution_options(**{_VERSIONS_OPTION: running_versions(source)})


def version_params(conn: sa.Connection, machine: str) -> dict[str, Any]:
    """``running`` and ``continuing`` for one label's history row (see the module's docstring)."""
    version, continuing = running_versions(conn).of(machine)
    return {"running": version, "continuing": continuing}


def version_for(conn: sa.Connection, machine: str, label_version: int | None) -> int | None:
    """The version a history row of a label of ``machine`` (its own: ``label_version``) carries."""
    version, continuing = running_versions(conn).of(machine)
    if continuing and label_version is not None:
        return label_version
    return version


@dataclass(frozen=True)
class Entry:
    """A history row that goes with no change to the label's row."""

    state_machine: str
    label: str
    old_state: str | None
    new_state: str | None
    forced: bool
    reason: str | None
    label_version: int | None  # the label's own version (``labels.version``)
    kind: str | None = None  # "errored"; None: what the states and forced say
