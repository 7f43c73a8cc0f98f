"""Lease rows: a lock that works through a transaction-mode pooler.

Behind PgBouncer in transaction mode (and without
``ROUTEMASTER_DIRECT_DATABASE_URL``) a session advisory lock would be taken
on whichever server connection ran the statement and left there. Work that
spans many transactions (applying a configuration, building search indexes)
is serialised instead by a row of ``leases``: taken when it is free or has
run out, renewed while held, deleted when done (routemaster/db/leases.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE leases (
            name text PRIMARY KEY,
            holder text NOT NULL,
            expires_at timestamptz NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE leases")
