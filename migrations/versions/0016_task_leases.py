"""Pull actions' leases set at each claim (SPEC E4): where each task's lease came from.

``tasks.lease_source`` (fixed, percentile, min or max) and ``tasks.lease_samples``
(the completions a percentile lease was taken over) say how the lease of
``tasks.lease`` was chosen, for explanations. ``tasks_completed`` gives a
claim the claim-to-completion durations of an action's latest completed
tasks without reading the rest of its history: a percentile lease reads at
most 100 of its entries.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE tasks ADD COLUMN lease_source text;
        ALTER TABLE tasks ADD COLUMN lease_samples integer;
        CREATE INDEX tasks_completed ON tasks (state_machine, state, ended_at)
            WHERE outcome = 'completed';
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX tasks_completed;
        ALTER TABLE tasks DROP COLUMN lease_samples;
        ALTER TABLE tasks DROP COLUMN lease_source;
        """
    )
