"""Push subscriptions: a cursor on the changes stream, and the one batch in flight.

A subscription's ``cursor`` is a changes-stream position (``cursor_xact``,
``cursor_id``: see ``routemaster/db/changes.py``): every change up to it has
been acknowledged. At most one batch is in flight: ``batch_id`` (its
``webhook-id``), the position of its last event and its body, kept so that
every re-send is the same request. A worker claims the row with a lease
(``lease_token`` names the claim, ``lease_until`` ends it); ``due_at`` is when
a worker should look at it next (a batch's delay, a backoff, a re-check).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE subscriptions (
            name text PRIMARY KEY,
            url text NOT NULL,
            state_machines text[],
            max_events integer NOT NULL,
            batch_delay_ms integer NOT NULL,
            signing_secret_env text,
            cursor_xact bigint NOT NULL,
            cursor_id bigint NOT NULL,
            batch_id text,
            batch_last_xact bigint,
            batch_last_id bigint,
            batch_events integer,
            batch_body bytea,
            due_at timestamptz NOT NULL DEFAULT now(),
            lease_token text,
            lease_until timestamptz,
            failures_in_a_row integer NOT NULL DEFAULT 0,
            last_attempt_at timestamptz,
            last_success_at timestamptz,
            last_error text,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX subscriptions_due ON subscriptions (due_at);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE subscriptions")
