"""Label names of any length in the indexes: a key column holds them, whole or hashed.

A btree index entry holds at most 2,704 bytes, and 1,024 varied 3- or
4-byte characters are 3-4 KiB that pglz cannot shrink: such a name could not
enter the primary key (state machine, name), so creating the label failed.
Now every btree index holds ``name_key`` instead, a stored column that
``routemaster_label_key(name)`` computes:

- a name of at most 1,024 bytes of UTF-8: exactly those bytes, so equality,
  uniqueness and order (byte order of UTF-8 is code-point order) are the
  name's own;
- a longer name: its first 1,024 bytes, the byte 0xFF, and the SHA-256 of the
  whole name (1,057 bytes). 0xFF never occurs in UTF-8, and these keys are
  longer than any short one, so a long name's key equals no short name's key;
  two long names sharing their first 1,024 bytes differ by their hashes, and
  sort among themselves by them.

The application computes the same key for its lookups
(``routemaster/db/keys.py``), and compares the full name as well.
``history_by_label`` becomes a hash index on ``label``: equality is all its
one query asks of it, and a hash index holds a name of any length.

PL/pgSQL, not SQL: a SQL function would be inlined, and so parsed again, for
every INSERT that computes the column; a PL/pgSQL function is compiled once
per connection. ``convert_to`` is only STABLE (it looks conversions up in
the catalog), but converting the database's text to UTF-8 never changes for a
given database, so the key function may be IMMUTABLE.

The upgrade rewrites ``labels`` (adding a stored column) and rebuilds its
indexes and ``history_by_label``, holding their locks meanwhile: time it on a
copy of a large database. The downgrade fails with "index row size exceeds
btree maximum" while a name too long for the old indexes exists.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION routemaster_label_key(name text) RETURNS bytea
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
        DECLARE
            utf8 bytea := convert_to(name, 'UTF8');
        BEGIN
            IF octet_length(utf8) <= 1024 THEN
                RETURN utf8;
            END IF;
            RETURN substring(utf8 FROM 1 FOR 1024) || decode('ff', 'hex') || sha256(utf8);
        END;
        $$;

        ALTER TABLE labels
            ADD COLUMN name_key bytea NOT NULL
                GENERATED ALWAYS AS (routemaster_label_key(name)) STORED,
            DROP CONSTRAINT labels_pkey,
            ADD CONSTRAINT labels_pkey PRIMARY KEY (state_machine, name_key);
        DROP INDEX labels_by_state;
        CREATE INDEX labels_by_state ON labels (state_machine, state, name_key) WHERE NOT deleted;
        DROP INDEX labels_errored;
        CREATE INDEX labels_errored ON labels (state_machine, state, name_key)
            WHERE errored AND NOT deleted;
        DROP INDEX history_by_label;
        CREATE INDEX history_by_label ON history USING hash (label);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX history_by_label;
        CREATE INDEX history_by_label ON history (state_machine, label, id);
        DROP INDEX labels_errored;
        CREATE INDEX labels_errored ON labels (state_machine, state, name)
            WHERE errored AND NOT deleted;
        DROP INDEX labels_by_state;
        CREATE INDEX labels_by_state ON labels (state_machine, state, name) WHERE NOT deleted;
        ALTER TABLE labels
            DROP CONSTRAINT labels_pkey,
            DROP COLUMN name_key,
            ADD CONSTRAINT labels_pkey PRIMARY KEY (state_machine, name);
        DROP FUNCTION routemaster_label_key(text);
        """
    )
