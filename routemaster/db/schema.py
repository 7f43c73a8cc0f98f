"""The tables, as SQLAlchemy Core metadata (the alembic migrations are the source of truth).

A label's current state lives on its row, written in the same transaction as
the history row that records the move, so "labels of machine M in state S" is
an index lookup and never a scan of history.

Work for the worker is a single column, ``due_at``: a label is due when
``due_at <= now()``. Claiming work moves ``due_at`` into the future by the
lease length, so a worker that dies mid-work simply lets the lease run out and
the label becomes due again.

Every table that grows with labels carries the label's ``shard_key``
(:func:`routemaster.db.keys.shard_key`, migration 0017), in its primary key
and unique indexes: the column Citus distributes them by.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

metadata = sa.MetaData()


class Xid8(sa.types.UserDefinedType[Any]):
    """PostgreSQL's 64-bit transaction id: which transaction wrote a history row."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "XID8"


labels = sa.Table(
    "labels",
    metadata,
    sa.Column("state_machine", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("metadata", postgresql.JSONB, nullable=False, server_default="{}"),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("state_entered_at", sa.DateTime(timezone=True), nullable=False),
    # id of the history row that moved the label into ``state``: the
    # idempotency token of an action entry, and the optimistic "is it still
    # where it was" check after remote calls.
    sa.Column("entry_id", sa.BigInteger, nullable=False),
    sa.Column("previous_state", sa.Text, nullable=True),
    sa.Column("deleted", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # worker bookkeeping
    sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("errored", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("lease_owner", sa.Text, nullable=True),
    # the lease's task id (migration 0007): live while lease_owner is set and due_at is ahead
    # what the indexes hold for the name: its UTF-8, or for a name over 1,024
    # bytes a prefix and a hash (db/keys.py, migration 0006; written by the application
    # since 0017)
    sa.Column("name_key", postgresql.BYTEA, primary_key=True),
    sa.Column("task_id", sa.Text, nullable=True),
    # when a pause with "until" ends by itself (migration 0007)
    sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
    # exact timers (migration 0012): the earliest moment the exit condition could hold, and
    # ``updated_at`` as it was when that and ``due_at`` were computed (behind it: recompute)
    sa.Column("next_check_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=True),
    # the machine version the label follows (``continue``) or was created under (``abort``);
    # NULL for ``upgrade`` machines, whose labels follow the definition in force (0015)
    sa.Column("version", sa.Integer, nullable=True),
    # the label's bucket (db/keys.py, migration 0017): Citus's distribution column
    sa.Column("shard_key", sa.Integer, primary_key=True),
    # flows (migration 0020, db/flows.py): a queued label's flow, key (JSON text) and the
    # moment it became due (its place in its key's queue; ``due_at`` is NULL meanwhile)
    sa.Column("flow", sa.Text, nullable=True),
    sa.Column("flow_key", sa.Text, nullable=True),
    sa.Column("flow_due_at", sa.DateTime(timezone=True), nullable=True),
)

sa.Index(
    "labels_by_state",
    labels.c.state_machine,
    labels.c.state,
    labels.c.name_key,
    postgresql_where=sa.not_(labels.c.deleted),
)
# The due indexes hold only labels that can be claimed (migration 0019).
_CLAIMABLE = sa.and_(sa.not_(labels.c.deleted), sa.not_(labels.c.paused), sa.not_(labels.c.errored))
sa.Index(
    "labels_due",
    labels.c.due_at,
    postgresql_where=sa.and_(labels.c.due_at.isnot(None), _CLAIMABLE),
)
sa.Index(
    "labels_by_task",
    labels.c.task_id,
    labels.c.shard_key,
    unique=True,
    postgresql_where=labels.c.task_id.isnot(None),
)
sa.Index("labels_leased", labels.c.due_at, postgresql_where=labels.c.lease_owner.isnot(None))
sa.Index(
    "labels_claimable",
    labels.c.state_machine,
    labels.c.state,
    labels.c.due_at,
    postgresql_where=sa.and_(labels.c.due_at.isnot(None), _CLAIMABLE),
)
sa.Index(
    "labels_unscheduled",
    labels.c.state_machine,
    labels.c.state,
    postgresql_where=sa.and_(
        sa.not_(labels.c.deleted), labels.c.scheduled_at.is_distinct_from(labels.c.updated_at)
    ),
)
sa.Index(
    "labels_paused_until",
    labels.c.paused_until,
    postgresql_where=labels.c.paused_until.isnot(None),
)
sa.Index(
    "labels_by_version",
    labels.c.state_machine,
    labels.c.version,
    labels.c.state,
    postgresql_where=sa.and_(labels.c.version.isnot(None), sa.not_(labels.c.deleted)),
)
sa.Index(
    "labels_errored",
    labels.c.state_machine,
    labels.c.state,
    labels.c.name_key,
    postgresql_where=sa.and_(labels.c.errored, sa.not_(labels.c.deleted)),
)
# flows (migration 0020): each key's queue in due order, and the labels holding slots
sa.Index(
    "labels_flow_queue",
    labels.c.flow,
    labels.c.flow_key,
    labels.c.flow_due_at,
    postgresql_where=sa.and_(labels.c.flow_due_at.isnot(None), _CLAIMABLE),
)
sa.Index(
    "labels_flow_holding",
    labels.c.flow,
    labels.c.flow_key,
    postgresql_where=sa.and_(labels.c.lease_owner.isnot(None), labels.c.flow.isnot(None)),
)
# retention (migration 0013): deleted labels by when they were deleted, labels by how long
# they have been in their state (finished labels)
sa.Index(
    "labels_deleted",
    labels.c.state_machine,
    labels.c.updated_at,
    postgresql_where=labels.c.deleted,
)
sa.Index(
    "labels_by_state_entered",
    labels.c.state_machine,
    labels.c.state,
    labels.c.state_entered_at,
    postgresql_where=sa.not_(labels.c.deleted),
)

history = sa.Table(
    "history",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger,
        sa.Sequence("history_id_seq"),
        primary_key=True,
        server_default=sa.text("nextval('history_id_seq'::regclass)"),
    ),
    sa.Column("state_machine", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("old_state", sa.Text, nullable=True),
    sa.Column("new_state", sa.Text, nullable=True),  # null: the label was deleted
    sa.Column("created", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("forced", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("reason", sa.Text, nullable=True),
    # the writing transaction: the changes stream orders by (xact_id, id) and
    # shows a row only once every transaction below it has finished
    sa.Column("xact_id", Xid8(), nullable=False, server_default=sa.text("routemaster_xact_id()")),
    # the machine version the label follows, or that the writing process ran (written by
    # every writer since migration 0017; a trigger set it before)
    sa.Column("version", sa.Integer, nullable=True),
    # NULL when the row's states and ``forced`` say what it was (created, moved,
    # deleted, forced); "errored" when the label became errored (migration 0009)
    sa.Column("kind", sa.Text, nullable=True),
    sa.Column("shard_key", sa.Integer, primary_key=True),
)

sa.Index("history_by_label", history.c.label, postgresql_using="hash")
sa.Index("history_by_position", history.c.xact_id, history.c.id)
sa.Index("history_by_machine_position", history.c.state_machine, history.c.xact_id, history.c.id)

trigger_occurrences = sa.Table(
    "trigger_occurrences",
    metadata,
    # "machine/state/trigger-index", and the occurrence it is for: the primary
    # key makes each interval or daily occurrence handled once across workers.
    sa.Column("trigger_key", sa.Text, primary_key=True),
    sa.Column("occurrence", sa.DateTime(timezone=True), primary_key=True),
    sa.Column(
        "handled_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    # the public part of the secret, to find the row; the secret itself is never stored
    sa.Column("key_id", sa.Text, nullable=False, unique=True),
    sa.Column("secret_hash", sa.Text, nullable=False),  # SHA-256 of the whole secret, hex
    sa.Column("scopes", postgresql.ARRAY(sa.Text), nullable=False),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
)

machine_versions = sa.Table(
    "machine_versions",
    metadata,
    sa.Column("machine", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("digest", sa.Text, nullable=False),
    sa.Column("definition", postgresql.JSONB, nullable=False),
    sa.Column(
        "applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column(
        "last_applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.UniqueConstraint("machine", "digest", name="machine_versions_digest"),
)

tasks = sa.Table(
    "tasks",
    metadata,
    # every task id ever issued (migration 0007): tells a never-issued id (404) from a
    # stale one (409), and which worker held each attempt
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("state_machine", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("entry_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("worker", sa.Text, nullable=False),
    sa.Column("lease", sa.Interval, nullable=False),
    sa.Column(
        "claimed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("outcome", sa.Text, nullable=True),
    # how the lease was chosen at the claim (migration 0016): fixed, percentile, min, max
    sa.Column("lease_source", sa.Text, nullable=True),
    sa.Column("lease_samples", sa.Integer, nullable=True),
    sa.Column("shard_key", sa.Integer, primary_key=True),
)

sa.Index("tasks_by_label", tasks.c.label, postgresql_using="hash")
sa.Index("tasks_by_claim", tasks.c.claimed_at)
sa.Index(
    "tasks_completed",
    tasks.c.state_machine,
    tasks.c.state,
    tasks.c.ended_at,
    postgresql_where=tasks.c.outcome == "completed",
)
deliveries = sa.Table(
    "deliveries",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger,
        sa.Sequence("deliveries_id_seq"),
        primary_key=True,
        server_default=sa.text("nextval('deliveries_id_seq'::regclass)"),
    ),
    sa.Column("kind", sa.Text, nullable=False),  # webhook, feed, subscription
    sa.Column("state_machine", sa.Text, nullable=True),
    sa.Column("label", sa.Text, nullable=True),
    sa.Column("state", sa.Text, nullable=True),
    sa.Column("url", sa.Text, nullable=False),  # userinfo and query values redacted
    sa.Column("receiver", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=True),
    sa.Column("trigger", sa.Text, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("duration_ms", sa.Integer, nullable=False),
    sa.Column("status", sa.Integer, nullable=True),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("response_excerpt", sa.Text, nullable=True),
    # the label's bucket; a delivery with no label (a subscription's batch) its receiver's
    sa.Column("shard_key", sa.Integer, primary_key=True),
)

sa.Index(
    "deliveries_by_label",
    deliveries.c.state_machine,
    sa.func.routemaster_label_key(deliveries.c.label),
    deliveries.c.id,
    postgresql_where=deliveries.c.label.isnot(None),
)
sa.Index("deliveries_by_started_at", deliveries.c.started_at)

receivers = sa.Table(
    "receivers",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("origin", sa.Text, nullable=False),
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("circuit", sa.Text, nullable=False, server_default="closed"),
    sa.Column("failures_in_a_row", sa.Integer, nullable=False, server_default="0"),
    # open: no call before; half_open: the probe's lease
    sa.Column("open_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("opened_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),  # Retry-After
    sa.Column("rate_at", sa.DateTime(timezone=True), nullable=True),  # the rate's arrival time
    sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
)

receiver_slots = sa.Table(
    "receiver_slots",
    metadata,
    sa.Column("receiver", sa.Text, primary_key=True),
    sa.Column("worker", sa.Text, primary_key=True),
    sa.Column("in_flight", sa.Integer, nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

subscriptions = sa.Table(
    "subscriptions",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("state_machines", postgresql.ARRAY(sa.Text), nullable=True),  # null: every machine
    sa.Column("max_events", sa.Integer, nullable=False),
    sa.Column("batch_delay_ms", sa.Integer, nullable=False),
    sa.Column("signing_secret_env", sa.Text, nullable=True),  # the variable's name, never its value
    # the changes-stream position every change up to which was acknowledged
    sa.Column("cursor_xact", sa.BigInteger, nullable=False),
    sa.Column("cursor_id", sa.BigInteger, nullable=False),
    # the one batch in flight: its webhook-id, its last event's position, its exact body
    sa.Column("batch_id", sa.Text, nullable=True),
    sa.Column("batch_last_xact", sa.BigInteger, nullable=True),
    sa.Column("batch_last_id", sa.BigInteger, nullable=True),
    sa.Column("batch_events", sa.Integer, nullable=True),
    sa.Column("batch_body", postgresql.BYTEA, nullable=True),
    # worker bookkeeping: when to look next, and the claim of the worker looking now
    sa.Column("due_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("lease_token", sa.Text, nullable=True),
    sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("failures_in_a_row", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # changes pruned before the subscription received them (migration 0013)
    sa.Column("lost_events", sa.BigInteger, nullable=False, server_default="0"),
)

sa.Index("subscriptions_due", subscriptions.c.due_at)

# Bulk commands (migration 0011): a job, and the labels it was accepted for.
bulk_jobs = sa.Table(
    "bulk_jobs",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger,
        sa.Sequence("bulk_jobs_id_seq"),
        primary_key=True,
        server_default=sa.text("nextval('bulk_jobs_id_seq'::regclass)"),
    ),
    sa.Column("state_machine", sa.Text, nullable=False),
    sa.Column("command", sa.Text, nullable=False),
    # the filters and the command's own arguments (``to``), as accepted
    sa.Column("arguments", postgresql.JSONB, nullable=False, server_default="{}"),
    sa.Column("reason", sa.Text, nullable=False),
    # ``pause`` with ``until``: the end of each label's pause
    sa.Column("pause_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("done", sa.Integer, nullable=False, server_default="0"),
    sa.Column("skipped", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed", sa.Integer, nullable=False, server_default="0"),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
)

sa.Index("bulk_jobs_running", bulk_jobs.c.id, postgresql_where=bulk_jobs.c.finished_at.is_(None))
sa.Index(
    "bulk_jobs_finished",
    bulk_jobs.c.finished_at,
    postgresql_where=bulk_jobs.c.finished_at.isnot(None),
)

bulk_items = sa.Table(
    "bulk_items",
    metadata,
    sa.Column(
        "job_id",
        sa.BigInteger,
        sa.ForeignKey("bulk_jobs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("name_key", postgresql.BYTEA, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    # NULL until a worker has handled the label: "done", "skipped" or "failed"
    sa.Column("outcome", sa.Text, nullable=True),
    sa.Column("shard_key", sa.Integer, primary_key=True),
)

sa.Index(
    "bulk_items_pending",
    bulk_items.c.job_id,
    bulk_items.c.name_key,
    postgresql_where=bulk_items.c.outcome.is_(None),
)

# Retention (migration 0013): per machine, the newest stream position pruning removed and
# how far its scan of history has got; per table, what pruning has done.
retention_horizons = sa.Table(
    "retention_horizons",
    metadata,
    sa.Column("state_machine", sa.Text, primary_key=True),
    sa.Column("pruned_xact", Xid8(), nullable=False, server_default="0"),
    sa.Column("pruned_id", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("scanned_xact", Xid8(), nullable=False, server_default="0"),
    sa.Column("scanned_id", sa.BigInteger, nullable=False, server_default="0"),
)

label_counts = sa.Table(
    "label_counts",
    metadata,
    # live labels per state up to label_counts_folded's position (db/label_counts.py)
    sa.Column("state_machine", sa.Text, primary_key=True),
    sa.Column("state", sa.Text, primary_key=True),
    sa.Column("count", sa.BigInteger, nullable=False),
)

label_counts_folded = sa.Table(
    "label_counts_folded",
    metadata,
    # one row: every history row before (xact, id) is in label_counts, none after
    sa.Column("one", sa.Boolean, primary_key=True, server_default=sa.true()),
    sa.Column("xact", Xid8(), nullable=False),
    sa.Column("id", sa.BigInteger, nullable=False),
    sa.Column("folded_at", sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("one"),
)

retention_progress = sa.Table(
    "retention_progress",
    metadata,
    sa.Column("table_name", sa.Text, primary_key=True),
    sa.Column("rows_pruned", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("horizon", sa.DateTime(timezone=True), nullable=True),
)

leases = sa.Table(
    "leases",
    metadata,
    # what is held ("configuration", "search indexes"), by whom, until when (database time)
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

# Flows (migration 0020, db/flows.py): each flow's virtual time, and each key's virtual
# start (the keys with queued labels are served in its order), weight and activity.
flows = sa.Table(
    "flows",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("vtime", sa.Float, nullable=False, server_default="0"),
)

flow_keys = sa.Table(
    "flow_keys",
    metadata,
    sa.Column("flow", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("vstart", sa.Float, nullable=False),
    sa.Column("weight", sa.Float, nullable=False, server_default="1"),
    sa.Column("active", sa.Boolean, nullable=False),
)
sa.Index(
    "flow_keys_ready",
    flow_keys.c.flow,
    flow_keys.c.vstart,
    flow_keys.c.key,
    postgresql_where=flow_keys.c.active,
)

# Child labels (migration 0021, SPEC G3): who spawned each child (beside the child), each
# parent's progress (beside the parent), and the wake-ups a finishing child leaves.
children = sa.Table(
    "children",
    metadata,
    sa.Column("shard_key", sa.Integer, nullable=False),
    sa.Column("state_machine", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("name_key", postgresql.BYTEA, nullable=False),
    sa.Column("parent_machine", sa.Text, nullable=False),
    sa.Column("parent_name", sa.Text, nullable=False),
    sa.Column("parent_key", postgresql.BYTEA, nullable=False),
    sa.Column("parent_shard_key", sa.Integer, nullable=False),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("depth", sa.Integer, nullable=False),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # "succeeded" or "failed" once the child has finished (the first finish counts)
    sa.Column("outcome", sa.Text, nullable=True),
    sa.PrimaryKeyConstraint("state_machine", "name_key", "shard_key"),
)

sa.Index(
    "children_of_parent", children.c.parent_machine, children.c.parent_key, children.c.position
)
sa.Index(
    "children_outcomes",
    children.c.parent_machine,
    children.c.parent_key,
    children.c.state_machine,
    children.c.outcome,
)

spawns = sa.Table(
    "spawns",
    metadata,
    sa.Column("shard_key", sa.Integer, nullable=False),
    sa.Column("state_machine", sa.Text, nullable=False),
    sa.Column("name_key", postgresql.BYTEA, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("entry_id", sa.BigInteger, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("spawned", sa.Integer, nullable=False, server_default="0"),
    sa.Column("depth", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("state_machine", "name_key", "shard_key"),
)

child_wakes = sa.Table(
    "child_wakes",
    metadata,
    sa.Column("shard_key", sa.Integer, nullable=False),
    sa.Column("parent_machine", sa.Text, nullable=False),
    sa.Column("parent_name", sa.Text, nullable=False),
    sa.Column("parent_key", postgresql.BYTEA, nullable=False),
    sa.Column("parent_shard_key", sa.Integer, nullable=False),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.PrimaryKeyConstraint("parent_machine", "parent_key", "parent_shard_key", "shard_key"),
)
