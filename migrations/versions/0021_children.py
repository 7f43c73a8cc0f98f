"""Child labels (SPEC G3): who spawned each child, each parent's progress, and wake-ups.

- ``children``: one row per child label, beside the child (its ``shard_key``): the
  parent it belongs to, its index in the parent's list, how deep the chain of spawns
  is, and its ``outcome`` once it has finished (written by the child's own transaction:
  one shard). Written in the same transaction as the child's label row. The parent
  counts its children by ``children_outcomes`` (an index-only scan) and lists them by
  ``children_of_parent``.
- ``spawns``: one row per parent waiting in a spawn state, beside the parent: the entry
  it spawned for, how many children it has and how many are spawned so far, updated in
  the transaction that creates each batch (a killed worker resumes where the last commit
  left it; ``INSERT ... ON CONFLICT DO NOTHING`` makes a batch written twice harmless).
- ``child_wakes``: a child that finishes (enters an ``outcome`` state, or is deleted)
  records its outcome and adds a row here in its own transaction, beside itself: never
  a write to the parent's row, so on Citus the child's commit stays on its shard. The
  worker turns them into the parents' due times and deletes them.

Three new, empty tables: no lock on an existing one. One statement per ``op.execute``;
``routemaster migrate`` distributes them by ``shard_key`` on Citus, co-located with
``labels`` (``routemaster/db/plumbing/migrate.py``).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_UPGRADE = [
    """
    CREATE TABLE children (
        shard_key integer NOT NULL,
        state_machine text NOT NULL,
        name text NOT NULL,
        name_key bytea NOT NULL,
        parent_machine text NOT NULL,
        parent_name text NOT NULL,
        parent_key bytea NOT NULL,
        parent_shard_key integer NOT NULL,
        position integer NOT NULL,
        depth integer NOT NULL,
        outcome text,
        created_at timestamp with time zone NOT NULL DEFAULT now(),
        PRIMARY KEY (state_machine, name_key, shard_key)
    )
    """,
    """
    CREATE INDEX children_of_parent ON children (parent_machine, parent_key, position)
    """,
    """
    CREATE INDEX children_outcomes ON children (parent_machine, parent_key, state_machine,
                                                outcome)
    """,
    """
    CREATE TABLE spawns (
        shard_key integer NOT NULL,
        state_machine text NOT NULL,
        name_key bytea NOT NULL,
        state text NOT NULL,
        entry_id bigint NOT NULL,
        total integer NOT NULL,
        spawned integer NOT NULL DEFAULT 0,
        depth integer NOT NULL,
        PRIMARY KEY (state_machine, name_key, shard_key)
    )
    """,
    """
    CREATE TABLE child_wakes (
        shard_key integer NOT NULL,
        parent_machine text NOT NULL,
        parent_name text NOT NULL,
        parent_key bytea NOT NULL,
        parent_shard_key integer NOT NULL,
        created_at timestamp with time zone NOT NULL DEFAULT now(),
        PRIMARY KEY (parent_machine, parent_key, parent_shard_key, shard_key)
    )
    """,
]

_DOWNGRADE = [
    "DROP TABLE child_wakes",
    "DROP TABLE spawns",
    "DROP TABLE children",
]


def upgrade() -> None:
    for statement in _UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DOWNGRADE:
        op.execute(statement)
