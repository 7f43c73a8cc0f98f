"""Pull workers' tasks, and pauses that end by themselves.

Pull workers: the lease a label is held under, and every task id ever issued.

``labels.task_id`` is the id of the lease the label is held under now (a
claim, or a webhook answered 202 with ``async_timeout``): a new lease gets a
new id, so fencing a stale worker is one equality in the statement that acts
on the label. The lease is live while ``lease_owner`` is set and ``due_at``
is in the future (every move and operator command clears ``lease_owner``);
``labels_leased`` finds the leases that ran out without reading the backlog
of due labels nobody has claimed yet, and ``labels_awaiting_claim`` gives a
claim each pull action's oldest due labels without reading the rest.

``tasks`` keeps every id issued, so an id that was never issued (404) can be
told from one whose lease is over (409), and so a label's attempts show who
held them and how each ended. The worker forgets tasks older than
``ROUTEMASTER_TASK_RETENTION`` (``tasks_by_claim``), never a label's current one.

``labels.paused_until`` is when a label paused with ``{"until": ...}`` resumes
by itself (Metafora's sleep); the worker resumes it then.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE labels ADD COLUMN task_id text;
        CREATE UNIQUE INDEX labels_by_task ON labels (task_id) WHERE task_id IS NOT NULL;
        CREATE INDEX labels_leased ON labels (due_at) WHERE lease_owner IS NOT NULL;
        CREATE INDEX labels_awaiting_claim ON labels (state_machine, state, due_at)
            WHERE lease_owner IS NULL AND due_at IS NOT NULL;
        ALTER TABLE labels ADD COLUMN paused_until timestamptz;
        CREATE INDEX labels_paused_until ON labels (paused_until) WHERE paused_until IS NOT NULL;
        CREATE TABLE tasks (
            id text PRIMARY KEY,
            state_machine text NOT NULL,
            label text NOT NULL,
            state text NOT NULL,
            entry_id bigint NOT NULL,
            attempt integer NOT NULL,
            worker text NOT NULL,
            lease interval NOT NULL,
            claimed_at timestamptz NOT NULL DEFAULT now(),
            ended_at timestamptz,
            outcome text
        );
        CREATE INDEX tasks_by_label ON tasks USING hash (label);
        CREATE INDEX tasks_by_claim ON tasks (claimed_at);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE tasks;
        DROP INDEX labels_paused_until;
        ALTER TABLE labels DROP COLUMN paused_until;
        DROP INDEX labels_awaiting_claim;
        DROP INDEX labels_leased;
        DROP INDEX labels_by_task;
        ALTER TABLE labels DROP COLUMN task_id;
        """
    )
