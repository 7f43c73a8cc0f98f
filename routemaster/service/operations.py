"""Operator commands: retry an errored label, pause and resume it, move it by force.

Each is recorded in the label's history as forced, with the operator's
reason, so an audit shows who unblocked what and when.
"""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.db import flows, label_claims, transitions
from routemaster.db import labels as store
from routemaster.db.labels import Label, Moves
from routemaster.db.notifications import notify_due
from routemaster.machine import Plan, evaluates_on_entry
from routemaster.service.labels import advance_locked, finish_in_request, write
from routemaster.service.refusals import InvalidOperation, LabelDeleted, LabelNotFound, Malformed
from routemaster.service.scheduling import arrival
from routemaster.service.transactions import writing
from routemaster.service.versions import machine_for


def retry_label(app: App, machine: StateMachine, name: str, *, reason: str | None = None) -> Label:
    """Make an errored label due again, with a fresh attempt count.

    The idempotency token stays the same: it is still the same entry into the action.
    """
    now = app.now()
    with writing(app) as conn:
        return retry_locked(conn, _locked_live_label(conn, machine, name), now=now, reason=reason)


def retry_locked(
    conn: sa.Connection, label: Label, *, now: datetime.datetime, reason: str | None
) -> Label:
    """:func:`retry_label` on a label the caller has locked (bulk commands use it too)."""
    if not label.errored:
        raise InvalidOperation(f"label {label.name!r} is not errored")
    [retried] = transitions.retry(conn, [label.key], now=now, reason=reason or "retried")
    return retried


def pause_end(app: App, until: datetime.datetime | None) -> datetime.datetime | None:
    """The end of a pause, if it is in the future (:class:`Malformed` if not)."""
    if until is not None and until <= app.now():
        raise Malformed('"until" must be in the future.')
    return until


def set_label_paused(
    app: App,
    machine: StateMachine,
    name: str,
    paused: bool,
    *,
    reason: str | None = None,
    until: datetime.datetime | None = None,
) -> Label:
    """A paused label is never evaluated or delivered until resumed.

    Whatever was triggered while it was paused is due on resume (updates and
    clock triggers mark a paused label due; the worker skips it until then).
    With ``until``, the worker resumes it by itself then (pausing again
    changes or removes the end).
    """
    with writing(app) as conn:
        label = _locked_live_label(conn, machine, name)
        return pause_locked(conn, label, paused, now=app.now(), reason=reason, until=until)


def pause_locked(
    conn: sa.Connection,
    label: Label,
    paused: bool,
    *,
    now: datetime.datetime,
    reason: str | None,
    until: datetime.datetime | None = None,
) -> Label:
    """:func:`set_label_paused` on a label the caller has locked; unchanged if it already is.

    The pause's end is set either way: ``until`` when pausing, none when resuming.
    """
    default = "paused" if paused else "resumed"
    if until is not None:
        default = f"paused until {until.isoformat()}"
    return _resume_queued(
        conn, transitions.pause(conn, label, paused, now=now, reason=reason or default, until=until)
    )


def _resume_queued(conn: sa.Connection, label: Label) -> Label:
    """A label resumed while queued in a flow (SPEC G2) is due again at once, so that the
    next claim puts it back in its key's queue, in its place."""
    if not label.paused and label.due_at is None and flows.requeue(conn, *label.key):
        notify_due(conn)
    return label


def resume_ended_pauses(app: App, *, limit: int = 100) -> int:
    """Resume the labels whose pause with ``until`` has ended; how many."""
    now = app.now()
    with writing(app) as conn:
        ended = label_claims.lock_ended(conn, now=now, limit=limit)
        for label in ended:
            resumed = transitions.pause(
                conn, label, False, now=now, reason="resumed: the pause ended"
            )
            _resume_queued(conn, resumed)
    return len(ended)


def force_move(
    app: App,
    machine: StateMachine,
    name: str,
    destination: str,
    *,
    reason: str | None = None,
    only_from: str | None = None,
) -> Label:
    """Move a label to ``destination`` regardless of conditions, marked as forced.

    The label enters the state like any other move: an action's webhook is
    owed, and a gate with an entry trigger is evaluated at once. With
    ``only_from``, a label no longer in that state is left as it is (a
    configuration migration applied twice moves nothing twice).
    """
    now = app.now()
    with writing(app) as conn:
        label = _locked_live_label(conn, machine, name)
        if only_from is not None and label.state != only_from:
            return label
        label, plan = move_locked(conn, app, machine, label, destination, now=now, reason=reason)
    if plan is None:
        return label
    return finish_in_request(app, machine, label, plan)


def move_locked(
    conn: sa.Connection,
    app: App,
    machine: StateMachine,
    label: Label,
    destination: str,
    *,
    now: datetime.datetime,
    reason: str | None,
) -> tuple[Label, Plan | None]:
    """:func:`force_move` on a label the caller has locked, up to the feeds a gate reads.

    The plan (``None`` unless the state entered is evaluated on entry) says
    whether feeds are still to be fetched; a caller that does not fetch them
    leaves the label due, for the worker to evaluate. The destination is a state of the
    definition that governs the label (its own version's, on a ``continue`` machine).
    """
    machine = machine_for(app, label) or machine
    try:
        entered = machine.get_state(destination)
    except KeyError:
        raise InvalidOperation(
            f"state machine {machine.name!r} has no state {destination!r}"
        ) from None
    due, next_check_at = arrival(
        app,
        machine,
        label.name,
        label.metadata,
        state=destination,
        previous_state=label.state,
        now=now,
    )
    forced = Moves(
        label,
        (destination,),
        due_at=due,
        forced=True,
        reason=reason or "moved by operator",
        next_check_at=next_check_at,
    )
    label = write(conn, app, [forced], now=now)[0]
    if not evaluates_on_entry(entered):
        return label, None
    return advance_locked(conn, app, machine, label, now=now)


def _locked_live_label(conn: sa.Connection, machine: StateMachine, name: str) -> Label:
    label = store.lock(conn, machine.name, name)
    if label is None:
        raise LabelNotFound(name)
    if label.deleted:
        raise LabelDeleted(name)
    return label
