"""Flow keys (SPEC G2): per-key queues on labels, and each flow's keys in turn.

- ``labels.flow``, ``labels.flow_key``, ``labels.flow_due_at``: a label due in an action
  with ``flow:`` is *queued* by the claim that first finds it (``db/flows.py``): its flow,
  its key (the JSON text of the key path's value, ``null`` when missing) and the moment it
  became due move into these columns and ``due_at`` becomes NULL, so the queued label
  leaves ``labels_due`` and ``labels_claimable`` (no other claim reads it again) and
  enters ``labels_flow_queue``, its key's queue in due order (FIFO within a key).
- ``labels_flow_holding``: the leased labels of flows (a call in flight, a pull task, a
  202 task), counted per key under the key's row lock to keep the cap exact.
- ``flows`` (one row per flow: its virtual time) and ``flow_keys`` (one row per key seen:
  its virtual start, weight, whether it has queued labels): small tables that no
  statement joins with ``labels``, so on Citus they stay on the coordinator (local
  tables), like ``receivers``; ``flow_keys_ready`` orders a flow's active keys by virtual
  start, which is how a claim finds the next keys to serve without reading the others.

One statement per ``op.execute`` (Citus propagates ``ALTER TABLE`` and ``CREATE INDEX``
on ``labels`` to its shards). Adding nullable columns without defaults rewrites nothing;
the two indexes are partial and start empty.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_UPGRADE = [
    """
    ALTER TABLE labels ADD COLUMN flow text, ADD COLUMN flow_key text,
                       ADD COLUMN flow_due_at timestamp with time zone
    """,
    """
    CREATE INDEX labels_flow_queue ON labels (flow, flow_key, flow_due_at)
        WHERE flow_due_at IS NOT NULL AND NOT deleted AND NOT paused AND NOT errored
    """,
    """
    CREATE INDEX labels_flow_holding ON labels (flow, flow_key)
        WHERE lease_owner IS NOT NULL AND flow IS NOT NULL
    """,
    """
    CREATE TABLE flows (
        name text PRIMARY KEY,
        vtime double precision NOT NULL DEFAULT 0
    )
    """,
    """
    CREATE TABLE flow_keys (
        flow text NOT NULL,
        key text NOT NULL,
        vstart double precision NOT NULL,
        weight double precision NOT NULL DEFAULT 1,
        active boolean NOT NULL,
        PRIMARY KEY (flow, key)
    )
    """,
    "CREATE INDEX flow_keys_ready ON flow_keys (flow, vstart, key) WHERE active",
]

_DOWNGRADE = [
    "DROP TABLE flow_keys",
    "DROP TABLE flows",
    "DROP INDEX labels_flow_holding",
    "DROP INDEX labels_flow_queue",
    "ALTER TABLE labels DROP COLUMN flow_due_at, DROP COLUMN flow_key, DROP COLUMN flow",
]


def upgrade() -> None:
    for statement in _UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DOWNGRADE:
        op.execute(statement)
