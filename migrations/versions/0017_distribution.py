"""A shard key on every row that belongs to a label, so the tables can be distributed (Citus).

Every table that grows with labels (``labels``, ``history``, ``tasks``,
``deliveries``, ``bulk_items``) gets ``shard_key integer NOT NULL``: the
label name's bucket, ``routemaster_shard_key(name)`` = the first two bytes of
the SHA-256 of its UTF-8, big-endian, modulo 4096 (``routemaster/db/keys.py``
computes the same number; the application always passes it). A label's rows
share it, so on Citus they are co-located, and a statement naming one label
and its ``shard_key`` runs on one shard (docs/deployment.md, "Running on
Citus"). A delivery with no label (a subscription's batch) takes its
receiver's bucket.

What Citus requires, and this migration makes true on every server:

- every primary key and unique index includes ``shard_key``. It comes last
  (``labels (state_machine, name_key, shard_key)``, ``history (id, shard_key)``,
  ``labels_by_task (task_id, shard_key)``, ...): the key is a function of the
  name, so uniqueness is unchanged, and on one server a statement that does
  not name the key (a batch joined by name, an old task id) still finds its
  row through the index;
- the distribution column is a plain column: ``shard_key`` is backfilled by a
  stored generated column whose expression is then dropped (one rewrite of
  each table, its new primary key built in the same ``ALTER TABLE``, instead
  of an UPDATE that would leave a dead copy of every row),
  and ``labels.name_key`` loses its expression too: the application writes it;
- no identity columns: ``history.id``, ``deliveries.id`` and ``bulk_jobs.id``
  take their values from plain sequences (continuing where the identities were);
- no trigger on history: ``history_version`` is dropped, every writer names
  the version (and ``xact_id``, the coordinator's transaction: a default would
  be evaluated on the worker when Citus pushes an ``INSERT ... SELECT`` down;
  the default stays for writers of older releases during a rolling deploy).

Distributing is not done here: ``routemaster migrate`` does it afterwards when
the ``citus`` extension is installed (``routemaster/db/plumbing/migrate.py``).
One statement per ``op.execute``: Citus refuses several commands in one
statement on distributed tables, and later migrations must do the same.

The upgrade rewrites ``labels``, ``history``, ``tasks``, ``deliveries`` and
``bulk_items`` (every index of each is rebuilt), holding their locks
meanwhile: writes wait for it. Measured on plain PostgreSQL 15 on this
project's shared 2-core machine (load about 10), with 1M labels, 2M history
rows, 100k tasks and 100k deliveries (759 MB): 236 s for the upgrade from
0016, 104 s for the downgrade (``/usr/bin/time`` around alembic's
``command.upgrade``/``downgrade``). Time it on a copy of a large database first.
The downgrade works on plain PostgreSQL (undistribute first on Citus:
``undistribute_table``).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# ``convert_to`` is only STABLE (it looks conversions up), but converting the database's text
# to UTF-8 never changes for a given database, so the function may be IMMUTABLE (as 0006's).
_SHARD_KEY_FUNCTION = """
    CREATE FUNCTION routemaster_shard_key(name text) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
    DECLARE
        digest bytea := sha256(convert_to(name, 'UTF8'));
    BEGIN
        RETURN (get_byte(digest, 0) * 256 + get_byte(digest, 1)) % 4096;
    END;
    $$
    """

# An identity column becomes a plain sequence default, continuing after the identity's last
# value: a new sequence is set past it, the identity (and its sequence) dropped, the new one
# takes the old name and belongs to the column (so pg_get_serial_sequence still finds it).
_IDENTITY_TO_SEQUENCE = [
    "CREATE SEQUENCE {table}_id_sequence AS bigint",
    "SELECT setval('{table}_id_sequence', nextval('{table}_id_seq'))",
    "ALTER TABLE {table} ALTER COLUMN id DROP IDENTITY",
    "ALTER SEQUENCE {table}_id_sequence RENAME TO {table}_id_seq",
    "ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id",
    "ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{table}_id_seq')",
]

_SEQUENCE_TO_IDENTITY = [
    "ALTER TABLE {table} ALTER COLUMN id DROP DEFAULT",
    "ALTER SEQUENCE {table}_id_seq RENAME TO {table}_id_sequence",
    "ALTER TABLE {table} ALTER COLUMN id ADD GENERATED {when} AS IDENTITY",
    "SELECT setval('{table}_id_seq', nextval('{table}_id_sequence'))",
    "DROP SEQUENCE {table}_id_sequence",
]

_IDENTITIES = (("history", "BY DEFAULT"), ("deliveries", "ALWAYS"), ("bulk_jobs", "BY DEFAULT"))

_UPGRADE = [
    _SHARD_KEY_FUNCTION,
    "DROP TRIGGER history_version ON history",
    "DROP FUNCTION routemaster_history_version()",
    # labels
    "ALTER TABLE labels ALTER COLUMN name_key DROP EXPRESSION",
    """
    ALTER TABLE labels
        ADD COLUMN shard_key integer NOT NULL
            GENERATED ALWAYS AS (routemaster_shard_key(name)) STORED,
        DROP CONSTRAINT labels_pkey,
        ADD CONSTRAINT labels_pkey PRIMARY KEY (state_machine, name_key, shard_key)
    """,
    "ALTER TABLE labels ALTER COLUMN shard_key DROP EXPRESSION",
    "DROP INDEX labels_by_task",
    """
    CREATE UNIQUE INDEX labels_by_task ON labels (task_id, shard_key) WHERE task_id IS NOT NULL
    """,
    # history
    """
    ALTER TABLE history
        ADD COLUMN shard_key integer NOT NULL
            GENERATED ALWAYS AS (routemaster_shard_key(label)) STORED,
        DROP CONSTRAINT history_pkey,
        ADD CONSTRAINT history_pkey PRIMARY KEY (id, shard_key)
    """,
    "ALTER TABLE history ALTER COLUMN shard_key DROP EXPRESSION",
    # tasks
    """
    ALTER TABLE tasks
        ADD COLUMN shard_key integer NOT NULL
            GENERATED ALWAYS AS (routemaster_shard_key(label)) STORED,
        DROP CONSTRAINT tasks_pkey,
        ADD CONSTRAINT tasks_pkey PRIMARY KEY (id, shard_key)
    """,
    "ALTER TABLE tasks ALTER COLUMN shard_key DROP EXPRESSION",
    # deliveries: a subscription's batch has no label, its receiver's bucket instead
    """
    ALTER TABLE deliveries
        ADD COLUMN shard_key integer NOT NULL
            GENERATED ALWAYS AS (routemaster_shard_key(COALESCE(label, receiver))) STORED,
        DROP CONSTRAINT deliveries_pkey,
        ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id, shard_key)
    """,
    "ALTER TABLE deliveries ALTER COLUMN shard_key DROP EXPRESSION",
    # bulk items
    """
    ALTER TABLE bulk_items
        ADD COLUMN shard_key integer NOT NULL
            GENERATED ALWAYS AS (routemaster_shard_key(name)) STORED,
        DROP CONSTRAINT bulk_items_pkey,
        ADD CONSTRAINT bulk_items_pkey PRIMARY KEY (job_id, name_key, shard_key)
    """,
    "ALTER TABLE bulk_items ALTER COLUMN shard_key DROP EXPRESSION",
    *(
        statement.format(table=table)
        for table, _ in _IDENTITIES
        for statement in _IDENTITY_TO_SEQUENCE
    ),
]

_DOWNGRADE = [
    *(
        statement.format(table=table, when=when)
        for table, when in _IDENTITIES
        for statement in _SEQUENCE_TO_IDENTITY
    ),
    "ALTER TABLE bulk_items DROP CONSTRAINT bulk_items_pkey",
    "ALTER TABLE bulk_items ADD CONSTRAINT bulk_items_pkey PRIMARY KEY (job_id, name_key)",
    "ALTER TABLE bulk_items DROP COLUMN shard_key",
    "ALTER TABLE deliveries DROP CONSTRAINT deliveries_pkey",
    "ALTER TABLE deliveries ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id)",
    "ALTER TABLE deliveries DROP COLUMN shard_key",
    "ALTER TABLE tasks DROP CONSTRAINT tasks_pkey",
    "ALTER TABLE tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (id)",
    "ALTER TABLE tasks DROP COLUMN shard_key",
    "ALTER TABLE history DROP CONSTRAINT history_pkey",
    "ALTER TABLE history ADD CONSTRAINT history_pkey PRIMARY KEY (id)",
    "ALTER TABLE history DROP COLUMN shard_key",
    "DROP INDEX labels_by_task",
    "CREATE UNIQUE INDEX labels_by_task ON labels (task_id) WHERE task_id IS NOT NULL",
    "ALTER TABLE labels DROP CONSTRAINT labels_pkey",
    "ALTER TABLE labels DROP COLUMN shard_key",
    # A stored column cannot get its expression back: it is made again (a rewrite of labels).
    "ALTER TABLE labels DROP COLUMN name_key",
    """
    ALTER TABLE labels ADD COLUMN name_key bytea NOT NULL
        GENERATED ALWAYS AS (routemaster_label_key(name)) STORED
    """,
    "ALTER TABLE labels ADD CONSTRAINT labels_pkey PRIMARY KEY (state_machine, name_key)",
    "CREATE INDEX labels_by_state ON labels (state_machine, state, name_key) WHERE NOT deleted",
    """
    CREATE INDEX labels_errored ON labels (state_machine, state, name_key)
        WHERE errored AND NOT deleted
    """,
    "DROP FUNCTION routemaster_shard_key(text)",
    # migration 0015's trigger function, as it was
    """
    CREATE FUNCTION routemaster_history_version() RETURNS trigger
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
    $$
    """,
    """
    CREATE TRIGGER history_version BEFORE INSERT ON history
        FOR EACH ROW EXECUTE FUNCTION routemaster_history_version()
    """,
]


def upgrade() -> None:
    for statement in _UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DOWNGRADE:
        op.execute(statement)
