"""Upgrade strategies (SPEC E4): the version a label was created under, and history's version.

``labels.version`` is the machine version a label follows when its machine's
``upgrade_strategy`` is ``continue`` (the version it was created under, until
a bulk ``upgrade`` moves it on), or the version it was created under when the
strategy is ``abort`` (an ``abort`` moves older ones away and stamps the new
version). It stays NULL for ``upgrade`` machines: their labels follow the
definition in force. ``labels_by_version`` serves the counts per version
(``plan --json``, ``/metrics``), the stranded check of a ``continue`` machine
(labels whose own version has their state are not stranded) and the ``abort`` pass.

History's ``version`` (migration 0008) comes from the writing process's
``routemaster.versions`` setting, except for the machines that setting lists
under ``"$continue"``: there a history row carries the label's own version
when it has one (one primary-key lookup of the label per row written).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE labels ADD COLUMN version integer;
        CREATE INDEX labels_by_version ON labels (state_machine, version, state)
            WHERE version IS NOT NULL AND NOT deleted;

        CREATE OR REPLACE FUNCTION routemaster_history_version() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            setting jsonb;
            own integer;
        BEGIN
            IF NEW.version IS NULL THEN
                setting := CAST(NULLIF(current_setting('routemaster.versions', true), '')
                                AS jsonb);
                IF setting IS NOT NULL
                   AND COALESCE(setting -> '$continue', '[]'::jsonb) ? NEW.state_machine THEN
                    SELECT labels.version INTO own FROM labels
                    WHERE labels.state_machine = NEW.state_machine
                      AND labels.name_key = routemaster_label_key(NEW.label)
                      AND labels.name = NEW.label;
                END IF;
                NEW.version := COALESCE(own, CAST(setting ->> NEW.state_machine AS integer));
            END IF;
            RETURN NEW;
        END;
        $$;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE OR REPLACE FUNCTION routemaster_history_version() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.version IS NULL THEN
                NEW.version := CAST(
                    CAST(NULLIF(current_setting('routemaster.versions', true), '') AS jsonb)
                        ->> NEW.state_machine
                    AS integer);
            END IF;
            RETURN NEW;
        END;
        $$;
        DROP INDEX labels_by_version;
        ALTER TABLE labels DROP COLUMN version;
        """
    )
