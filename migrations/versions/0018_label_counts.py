"""Labels per state, kept: ``label_counts`` and the history position it is folded to.

``label_counts (state_machine, state, count)`` holds the live labels per
state as of the history position in ``label_counts_folded`` (one row); the
worker folds history into it and readers add the history after it
(``routemaster/db/label_counts.py``). Both are small tables of the
coordinator on Citus (never distributed).

The counts are seeded by ``routemaster migrate`` after this migration (and
after distributing, on Citus): until then ``label_counts_folded`` has no row
and readers count labels as before. Pure DDL: fast at any size.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE label_counts (
            state_machine text NOT NULL,
            state text NOT NULL,
            count bigint NOT NULL,
            PRIMARY KEY (state_machine, state)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE label_counts_folded (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            xact xid8 NOT NULL,
            id bigint NOT NULL,
            folded_at timestamptz NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE label_counts_folded")
    op.execute("DROP TABLE label_counts")
