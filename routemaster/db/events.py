"""A change as its JSON object: the ``data`` of a changes-stream event, and a subscription's event.

One definition for both, so a push subscriber and a stream reader see the
same fields (a subscription's event adds the position as ``"id"``).
"""

from __future__ import annotations

from typing import Any

from routemaster.db.changes import Change


def change_data(change: Change) -> dict[str, Any]:
    """The changes stream's ``data:`` object for ``change``."""
    return {
        "state_machine": change.state_machine,
        "label": change.label,
        "kind": change.kind,
        "old_state": change.old_state,
        "new_state": change.new_state,
        "at": change.at.isoformat(),
        "forced": change.forced,
        "reason": change.reason,
        "version": change.version,
    }


def subscription_event(change: Change) -> dict[str, Any]:
    """A push subscription's event: the stream's object plus ``"id"``, its position."""
    return {"id": str(change.position), **change_data(change)}
