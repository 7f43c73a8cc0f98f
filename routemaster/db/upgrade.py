"""Bring a database to the current schema, and seed what the store keeps from its rows.

The schema is the plumbing's (:mod:`routemaster.db.plumbing.migrate`: the
alembic migrations, then on Citus the tables distributed); what the store
keeps from the rows is seeded here once it is: the kept label counts
(:mod:`routemaster.db.label_counts`), counted once and folded from then on.
Every process that migrates at start-up (``serve``, ``cron``, ``migrate``)
calls :func:`upgrade`.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from routemaster.db import label_counts
from routemaster.db.horizon import Horizon, prepared_everywhere
from routemaster.db.plumbing.migrate import hold_migration_lock, labels_distributed, migrate

SETTLE_SECONDS = 30.0
"""How long a recount waits for transactions prepared on Citus workers to finish."""


def upgrade(engine: sa.Engine, revision: str = "head", *, recount: bool = False) -> None:
    """Migrate ``engine``'s database to ``revision`` (:func:`migrate`), then seed the kept
    label counts if they are not yet (``recount``: counted afresh anyway, :func:`keep_counts`).
    """
    migrate(engine, revision)
    keep_counts(engine, recount=recount)


def keep_counts(engine: sa.Engine, *, recount: bool = False) -> bool:
    """Seed the kept label counts if they are not kept yet (``recount``: again anyway).

    Whether it counted. Writes to labels wait while it counts (one grouped
    count of the live labels, by the ``labels_by_state`` index). Under the
    migration lock, after distributing: on Citus the count is of the shards.
    """
    with engine.begin() as connection:
        hold_migration_lock(connection)
        if not label_counts.has_table(connection):
            return False  # migrated to a revision before the kept counts
        if not recount and label_counts.kept(connection):
            return False
        citus = labels_distributed(connection)

        def settle() -> None:
            # Transactions that committed on the coordinator before the lock may still be
            # prepared on a worker (their rows invisible there): wait until they are not.
            if not citus:
                return
            held = prepared_everywhere(connection)
            if held is None:
                raise RuntimeError("a Citus worker did not answer")
            deadline = time.monotonic() + SETTLE_SECONDS
            while held:
                if time.monotonic() >= deadline:
                    raise RuntimeError("a Citus worker kept a transaction prepared, or is down")
                time.sleep(0.05)
                now = prepared_everywhere(connection)
                held = held if now is None else held & now

        label_counts.recount(connection, Horizon.coordinator, settle=settle)
        return True
