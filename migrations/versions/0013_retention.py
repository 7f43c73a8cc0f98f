"""Retention: where pruning has reached, what it has done, and what subscriptions lost to it.

``retention_horizons`` holds, per state machine, the newest stream position
whose history row pruning removed (``pruned``: the changes stream answers a
cursor below it with a gap) and how far the age-based scan of history has
got (``scanned``: the next batch starts after it, so kept rows, each
label's current entry, are read once and not again at every run).

``retention_progress`` counts the rows pruned per table and when pruning
last ran, for ``/metrics``. ``subscriptions.lost_events`` counts the
changes a subscription never received because pruning removed them (or
skipped them) before it got there.

Two partial indexes find pruning's work without a scan: deleted labels by
when they were deleted (``updated_at``: a deleted label is never updated
again), labels by how long they have been in their state; finished bulk
jobs by when they finished.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE retention_horizons (
            state_machine text PRIMARY KEY,
            pruned_xact xid8 NOT NULL DEFAULT '0',
            pruned_id bigint NOT NULL DEFAULT 0,
            scanned_xact xid8 NOT NULL DEFAULT '0',
            scanned_id bigint NOT NULL DEFAULT 0
        );
        CREATE TABLE retention_progress (
            table_name text PRIMARY KEY,
            rows_pruned bigint NOT NULL DEFAULT 0,
            last_run_at timestamptz,
            horizon timestamptz
        );
        ALTER TABLE subscriptions ADD COLUMN lost_events bigint NOT NULL DEFAULT 0;
        CREATE INDEX labels_deleted ON labels (state_machine, updated_at) WHERE deleted;
        CREATE INDEX labels_by_state_entered ON labels (state_machine, state, state_entered_at)
            WHERE NOT deleted;
        CREATE INDEX bulk_jobs_finished ON bulk_jobs (finished_at) WHERE finished_at IS NOT NULL;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX bulk_jobs_finished;
        DROP INDEX labels_by_state_entered;
        DROP INDEX labels_deleted;
        ALTER TABLE subscriptions DROP COLUMN lost_events;
        DROP TABLE retention_progress;
        DROP TABLE retention_horizons;
        """
    )
