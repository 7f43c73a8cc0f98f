"""The label service: what the API and the worker do to labels.

It orchestrates the store (:mod:`routemaster.db`), the planner
(:mod:`routemaster.machine`) and feeds over HTTP (:mod:`routemaster.http`),
and never holds a transaction while waiting on a remote server.
:mod:`~routemaster.service.labels` creates, updates, deletes and advances labels;
:mod:`~routemaster.service.operations` holds the operator commands.
"""

from routemaster.db.labels import HistoryEntry, Label
from routemaster.service.labels import (
    Settled,
    advance,
    advance_with_feeds,
    create_label,
    delete_label,
    get_label,
    history,
    label_context,
    settle_batch,
    update_metadata,
)
from routemaster.service.operations import (
    force_move,
    pause_end,
    resume_ended_pauses,
    retry_label,
    set_label_paused,
)
from routemaster.service.refusals import InvalidOperation, LabelDeleted, LabelExists, LabelNotFound

__all__ = [
    "HistoryEntry",
    "InvalidOperation",
    "Label",
    "LabelDeleted",
    "LabelExists",
    "LabelNotFound",
    "Settled",
    "advance",
    "advance_with_feeds",
    "create_label",
    "delete_label",
    "force_move",
    "get_label",
    "history",
    "label_context",
    "pause_end",
    "resume_ended_pauses",
    "retry_label",
    "set_label_paused",
    "settle_batch",
    "update_metadata",
]
