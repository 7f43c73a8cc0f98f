"""Machine versions: each distinct definition a process started with, and history's ``version``.

``machine_versions`` holds one row per distinct definition of a machine (the
machine as ``GET /state-machines/{sm}`` shows it: no header values, no
secrets), numbered from 1 per machine; ``digest`` (SHA-256 of the canonical
JSON) makes a definition seen again keep its number. ``last_applied_at`` says
which definition a process started with most recently: what ``plan``
compares a new configuration against.

``history.version`` is the version the writing process ran. Every writer of
history is left as it was: a trigger reads the version from the session
setting ``routemaster.versions`` (a JSON object, machine -> version) that a
process sets on each of its connections (``routemaster/db/versions.py``).
Rows written without it (before this migration, or by a process that
recorded no version) have none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE machine_versions (
            machine text NOT NULL,
            version integer NOT NULL,
            digest text NOT NULL,
            definition jsonb NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now(),
            last_applied_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT machine_versions_pkey PRIMARY KEY (machine, version),
            CONSTRAINT machine_versions_digest UNIQUE (machine, digest)
        );

        ALTER TABLE history ADD COLUMN version integer;

        CREATE FUNCTION routemaster_history_version() RETURNS trigger
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

        CREATE TRIGGER history_version BEFORE INSERT ON history
            FOR EACH ROW EXECUTE FUNCTION routemaster_history_version();
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER history_version ON history;
        DROP FUNCTION routemaster_history_version();
        ALTER TABLE history DROP COLUMN version;
        DROP TABLE machine_versions;
        """
    )
