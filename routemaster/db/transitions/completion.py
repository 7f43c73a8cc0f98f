"""A pull task's completion: its lease ended, its metadata merged."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from routemaster.db.catalogue import RETURNED_FROM_LABELS
from routemaster.db.labels import Label, label_from_row
from routemaster.db.statements import fetch_all


def complete_tasks(
    conn: sa.Connection,
    completions: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    now: datetime.datetime,
) -> dict[str, Label]:
    """End the live leases among these (task id, metadata patch) and merge each patch.

    Many pull-worker tasks completed at once (``POST /tasks/complete``), in one statement,
    each row fenced exactly as a single completion is (:mod:`routemaster.db.tasks`):
    ``labels.task_id`` is the id, the label is still leased, the lease has not run out;
    the metadata merged as :func:`merge_metadata` merges it. The ids must be distinct.
    Returns, by task id, each label whose lease was live: locked, its lease ended and its
    metadata merged, still in the action and not due (the caller moves it on). Ids absent
    from the answer held no live lease and changed nothing.
    """
    if not completions:
        return {}
    rows = fetch_all(
        conn,
        _COMPLETE_TASKS,
        {
            "ids": [task_id for task_id, _ in completions],
            "patches": [json.dumps(patch) if patch else None for _, patch in completions],
            "now": now,
        },
    )
    return {row[0]: label_from_row(tuple(row[1:])) for row in rows}


# One row per live lease among the ids: the task id, then the label as it is now.
_COMPLETE_TASKS = f"""
    WITH asked AS (
        SELECT * FROM unnest(CAST(%(ids)s AS text[]), CAST(%(patches)s AS text[]))
                      AS a(id, patch)
    ), taken AS (
        UPDATE labels SET lease_owner = NULL, task_id = NULL, due_at = NULL,
                          updated_at = %(now)s,
                          scheduled_at = CASE WHEN labels.scheduled_at = labels.updated_at
                                              THEN %(now)s ELSE labels.scheduled_at END,
                          metadata = CASE WHEN asked.patch IS NULL THEN labels.metadata
                                          ELSE routemaster_deep_merge(labels.metadata,
                                                                      CAST(asked.patch AS jsonb))
                                     END
        FROM asked
        WHERE labels.task_id = asked.id AND labels.lease_owner IS NOT NULL
          AND labels.due_at > %(now)s AND NOT labels.deleted AND NOT labels.errored
        RETURNING asked.id AS task_id, {RETURNED_FROM_LABELS}
    ), ended AS (
        UPDATE tasks SET ended_at = %(now)s, outcome = 'completed'
        FROM taken WHERE tasks.id = taken.task_id
    )
    SELECT * FROM taken
    """
