"""A deep-merge function for metadata, so a PATCH is one UPDATE statement.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nested objects merge key by key; any other value (lists, null) replaces.
    op.execute(
        """
        CREATE FUNCTION routemaster_deep_merge(base jsonb, patch jsonb) RETURNS jsonb
        LANGUAGE plpgsql IMMUTABLE STRICT AS $$
        DECLARE
            merged jsonb := base;
            item record;
        BEGIN
            IF jsonb_typeof(base) <> 'object' OR jsonb_typeof(patch) <> 'object' THEN
                RETURN patch;
            END IF;
            FOR item IN SELECT key, value FROM jsonb_each(patch) LOOP
                IF jsonb_typeof(merged -> item.key) = 'object'
                   AND jsonb_typeof(item.value) = 'object' THEN
                    merged := jsonb_set(merged, ARRAY[item.key],
                                        routemaster_deep_merge(merged -> item.key, item.value));
                ELSE
                    merged := jsonb_set(merged, ARRAY[item.key], item.value);
                END IF;
            END LOOP;
            RETURN merged;
        END;
        $$;
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION routemaster_deep_merge(jsonb, jsonb)")
