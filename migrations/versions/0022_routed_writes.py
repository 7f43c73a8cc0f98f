"""The transaction a history row names, given by a write sent to a Citus node (SPEC G1).

A history row's position in the changes stream is the id of the transaction
that wrote it on the coordinator. A write of one label sent straight to the
Citus node holding the label's shard (``routemaster/db/nodes.py``) runs in a
transaction of that node, whose id says nothing against the coordinator's;
so it takes a transaction id on the coordinator first and hands it to its
node transaction as the setting ``routemaster.xact_id``.
``routemaster_xact_id()`` is that id when it is set, else
``pg_current_xact_id()`` as before: every history writer names it, and on
one server, or through the coordinator, nothing changes. ``history.xact_id``
defaults to it too.

A function and a column default: no rewrite, no lock held for long. On Citus
``CREATE FUNCTION`` is propagated to every node, and the default to every
shard.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_UPGRADE = [
    """
    CREATE OR REPLACE FUNCTION routemaster_xact_id() RETURNS xid8
    LANGUAGE sql VOLATILE PARALLEL UNSAFE
    AS $$
        SELECT coalesce(CAST(nullif(current_setting('routemaster.xact_id', true), '') AS xid8),
                        pg_current_xact_id())
    $$
    """,
    "ALTER TABLE history ALTER COLUMN xact_id SET DEFAULT routemaster_xact_id()",
]

_DOWNGRADE = [
    "ALTER TABLE history ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id()",
    "DROP FUNCTION routemaster_xact_id()",
]


def upgrade() -> None:
    for statement in _UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DOWNGRADE:
        op.execute(statement)
