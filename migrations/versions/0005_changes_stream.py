"""The changes stream: each history row carries the id of the transaction that wrote it.

A reader of the stream returns only rows whose transaction id is below the
oldest transaction still running (``pg_snapshot_xmin``), ordered by
(transaction id, history id). A transaction that took its history ids early
and commits late still sorts where a reader has not yet been, so resuming
from a position never skips it.

Rows written before this migration read as transaction 0: they come first,
in id order. The default is set after the column exists so that adding the
column rewrites nothing.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE history ADD COLUMN xact_id xid8 NOT NULL DEFAULT '0';
        ALTER TABLE history ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id();
        CREATE INDEX history_by_position ON history (xact_id, id);
        CREATE INDEX history_by_machine_position ON history (state_machine, xact_id, id);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX history_by_machine_position;
        DROP INDEX history_by_position;
        ALTER TABLE history DROP COLUMN xact_id;
        """
    )
