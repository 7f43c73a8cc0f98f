"""API tokens (hashes only), and an index for counting errored labels.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ``key_id`` is the public part of a secret (rm_<key_id>_<random>), used to find the
    # row; ``secret_hash`` is the SHA-256 of the whole secret, compared in constant time.
    op.execute(
        """
        CREATE TABLE api_tokens (
            name         text        PRIMARY KEY,
            key_id       text        NOT NULL UNIQUE,
            secret_hash  text        NOT NULL,
            scopes       text[]      NOT NULL,
            created_at   timestamptz NOT NULL DEFAULT now(),
            last_used_at timestamptz
        );
        CREATE INDEX labels_errored ON labels (state_machine, state, name)
            WHERE errored AND NOT deleted;
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX labels_errored; DROP TABLE api_tokens;")
