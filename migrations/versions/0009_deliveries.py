"""The delivery log, receivers, and errored entries in history.

- ``deliveries``: one row per outbound call (action webhook, feed fetch,
  subscription batch), kept for ``ROUTEMASTER_DELIVERY_RETENTION`` and pruned
  by the workers oldest first (by ``id``) in bounded batches. Label deliveries
  are found through ``routemaster_label_key(label)`` (any label length fits a
  btree entry that way, see 0006); listings page newest first by ``id``.
- ``receivers``: per origin, the state every worker shares: paused, the
  circuit (``closed``/``open``/``half_open``), consecutive failures, when the
  next call may go (``open_until`` for the circuit or a probe's lease,
  ``not_before`` for ``Retry-After``, ``rate_at`` the rate limiter's
  theoretical arrival time).
- ``receiver_slots``: how many calls each worker has in flight to a receiver
  with ``max_in_flight``; a row past ``expires_at`` (its worker died) counts
  for nothing.
- ``history.kind``: NULL for every row written before (and for the kinds a
  row's states and ``forced`` already say: created, moved, deleted, forced);
  set to ``errored`` when a label becomes errored. Adding a nullable column
  without a default does not rewrite the table.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE deliveries (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            kind text NOT NULL,
            state_machine text,
            label text,
            state text,
            url text NOT NULL,
            receiver text NOT NULL,
            attempt integer,
            trigger text NOT NULL,
            started_at timestamptz NOT NULL,
            duration_ms integer NOT NULL,
            status integer,
            outcome text NOT NULL,
            error text,
            response_excerpt text
        );
        CREATE INDEX deliveries_by_label
            ON deliveries (state_machine, routemaster_label_key(label), id)
            WHERE label IS NOT NULL;
        CREATE INDEX deliveries_by_started_at ON deliveries (started_at);

        CREATE TABLE receivers (
            id text PRIMARY KEY,
            origin text NOT NULL,
            paused boolean NOT NULL DEFAULT false,
            circuit text NOT NULL DEFAULT 'closed',
            failures_in_a_row integer NOT NULL DEFAULT 0,
            open_until timestamptz,
            opened_at timestamptz,
            not_before timestamptz,
            rate_at timestamptz,
            last_success_at timestamptz,
            last_failure_at timestamptz,
            last_error text
        );

        CREATE TABLE receiver_slots (
            receiver text NOT NULL,
            worker text NOT NULL,
            in_flight integer NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (receiver, worker)
        );

        ALTER TABLE history ADD COLUMN kind text;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE history DROP COLUMN kind;
        DROP TABLE receiver_slots;
        DROP TABLE receivers;
        DROP TABLE deliveries;
        """
    )
