"""The due indexes hold only labels that can be claimed (SPEC F2).

A paused label keeps its ``due_at`` (the work is owed to it when it is
resumed), and so do errored and deleted ones until they are dealt with. The
claims (``claims._LOCK_GATES``, ``claims._NEXT_DUE``, the delivery claims,
the pull claim) read ``labels_due`` or ``labels_awaiting_claim`` in due order
and filtered ``NOT paused AND NOT errored AND NOT deleted`` afterwards, so
every round walked every paused overdue label: with 100,000 of them an idle
``cron`` cost its PostgreSQL 5.6 s of CPU a minute. Now:

- ``labels_due (due_at)`` holds only claimable labels (``NOT deleted AND NOT
  paused AND NOT errored``): the statements already say so, so PostgreSQL uses
  it unchanged; pausing, erroring or deleting a label takes it out, resuming
  puts it back with the due time it kept;
- ``labels_claimable (state_machine, state, due_at)``, claimable labels too,
  replaces ``labels_awaiting_claim`` (which also left out leased labels): the
  pull claim reads it per pull action as before (a lease in flight is due in
  the future, out of its range), and a delivery claim reads it per route when
  a receiver may not be called (open circuit, paused, rate), so that
  receiver's labels are never read.

One statement per ``op.execute`` (Citus: ``CREATE INDEX`` and ``DROP INDEX``
on a distributed table are propagated to its shards). Each index is built
while writes to ``labels`` wait (as any ``CREATE INDEX``); time it on a copy
of a large database first.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_CLAIMABLE = "NOT deleted AND NOT paused AND NOT errored"

_UPGRADE = [
    "DROP INDEX labels_due",
    f"CREATE INDEX labels_due ON labels (due_at) WHERE due_at IS NOT NULL AND {_CLAIMABLE}",
    "DROP INDEX labels_awaiting_claim",
    f"""
    CREATE INDEX labels_claimable ON labels (state_machine, state, due_at)
        WHERE due_at IS NOT NULL AND {_CLAIMABLE}
    """,
]

_DOWNGRADE = [
    "DROP INDEX labels_claimable",
    """
    CREATE INDEX labels_awaiting_claim ON labels (state_machine, state, due_at)
        WHERE lease_owner IS NULL AND due_at IS NOT NULL
    """,
    "DROP INDEX labels_due",
    "CREATE INDEX labels_due ON labels (due_at) WHERE due_at IS NOT NULL",
]


def upgrade() -> None:
    for statement in _UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DOWNGRADE:
        op.execute(statement)
