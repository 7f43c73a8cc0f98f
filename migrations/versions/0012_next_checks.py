"""Exact timers (SPEC E1): each label's next check, and which rows still need one.

``next_check_at`` is the earliest moment a label's exit condition could hold
with the metadata it has (``NULL``: not until its metadata changes, or not in
a gate evaluated at moments); ``due_at`` already says when the worker
evaluates it. ``scheduled_at`` is ``updated_at`` as it was when both were
computed: a row written since by something that did not compute them (a
process of an older release during a rolling deploy, a renaming migration, or
every row at this upgrade) has ``scheduled_at`` behind ``updated_at``, and
the partial index ``labels_unscheduled`` lists exactly those rows, so
``migrate -c`` and the workers find them without scanning the table.

Adding two nullable columns without a default rewrites nothing; the index
build reads the table once.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE labels ADD COLUMN next_check_at timestamptz,
                           ADD COLUMN scheduled_at timestamptz;
        CREATE INDEX labels_unscheduled ON labels (state_machine, state)
            WHERE NOT deleted AND scheduled_at IS DISTINCT FROM updated_at;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX labels_unscheduled;
        ALTER TABLE labels DROP COLUMN scheduled_at, DROP COLUMN next_check_at;
        """
    )
