"""Deep merge in time linear in the patch and the stored metadata.

0002's merge called ``jsonb_set`` once per key of the patch, copying the
whole object each time: quadratic (8,000 keys took 4 s, holding the label's
row lock). This one builds each object of the result once: per object,
``base || patch`` (one linear pass) and one ``jsonb_object_agg`` over only the
keys that are objects on both sides, merged one level down. A child whose
patch has no such keys of its own is concatenated in place instead of by a
recursive call, which halves the calls for the common two-level shape.

PL/pgSQL, not SQL: a SQL function is inlined and ``base -> key`` then reads
(detoasts) the stored value again for every key; a PL/pgSQL parameter is
read once.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

LINEAR = """
CREATE OR REPLACE FUNCTION routemaster_deep_merge(base jsonb, patch jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    nested jsonb;
BEGIN
    IF jsonb_typeof(base) <> 'object' OR jsonb_typeof(patch) <> 'object' THEN
        RETURN patch;
    END IF;
    SELECT jsonb_object_agg(
               p.key,
               CASE WHEN EXISTS (SELECT 1 FROM jsonb_each(p.value) AS q
                                 WHERE jsonb_typeof(q.value) = 'object'
                                   AND jsonb_typeof(base -> p.key -> q.key) = 'object')
                    THEN routemaster_deep_merge(base -> p.key, p.value)
                    ELSE (base -> p.key) || p.value
               END)
      INTO nested
      FROM jsonb_each(patch) AS p
     WHERE jsonb_typeof(p.value) = 'object' AND jsonb_typeof(base -> p.key) = 'object';
    IF nested IS NULL THEN
        RETURN base || patch;
    END IF;
    RETURN base || patch || nested;
END;
$$;
"""

QUADRATIC = """
CREATE OR REPLACE FUNCTION routemaster_deep_merge(base jsonb, patch jsonb) RETURNS jsonb
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


def upgrade() -> None:
    op.execute(LINEAR)


def downgrade() -> None:
    op.execute(QUADRATIC)
