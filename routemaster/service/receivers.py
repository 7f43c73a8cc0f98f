"""Receivers: the configured ones and their rows, pausing them, retrying their labels.

A receiver is an origin outbound calls reach (``routemaster.config.origins``);
its shared state (circuit, pause) is a row every worker reads before it
claims work for it (``routemaster.db.receivers``).
"""

from __future__ import annotations

import datetime

from routemaster.app import App
from routemaster.config.origins import Receiver, configured_receivers
from routemaster.config.receiver_rules import policy_for
from routemaster.db import receiver_labels, receivers
from routemaster.db.receivers import ReceiverRow
from routemaster.service.refusals import Missing
from routemaster.service.transactions import reading, writing

__all__ = [
    "Receiver",
    "ReceiverRow",
    "ReceiverStatus",
    "known_receiver",
    "receiver_statuses",
    "retry_errored",
    "set_receiver_paused",
]

ReceiverStatus = tuple[str, Receiver | None, ReceiverRow | None, tuple[int, int]]
"""A receiver's id, its configuration (if configured), its row (if any), (waiting, in flight)."""


def receiver_statuses(app: App) -> list[ReceiverStatus]:
    """Every receiver the configuration reaches, and any other with a row, by id."""
    configured = configured_receivers(app.config)
    now = app.now()
    with reading(app) as conn:
        rows = {row.id: row for row in receivers.all_receivers(conn)}
        routes = [
            (receiver.id, machine, state)
            for receiver in configured.values()
            for machine, state in receiver.action_states
        ]
        counts = receiver_labels.counts(conn, routes, now=now)
    ids = sorted(set(configured) | set(rows))
    return [
        (ident, configured.get(ident), rows.get(ident), counts.get(ident, (0, 0))) for ident in ids
    ]


def set_receiver_paused(app: App, ident: str, *, paused: bool) -> Receiver:
    """Pause or resume a receiver (:class:`Missing` if unknown)."""
    known = known_receiver(app, ident)
    with writing(app) as conn:
        receivers.ensure(conn, [(known.id, known.origin)])
        receivers.set_receiver_paused(conn, known.id, paused=paused)
    return known


def retry_errored(
    app: App,
    known: Receiver,
    *,
    since: datetime.datetime,
    until: datetime.datetime,
    now: datetime.datetime,
    reason: str,
) -> int:
    """Make due again the labels that became errored against ``known`` in [since, until)."""
    with writing(app) as conn:
        return receiver_labels.retry_errored(
            conn, known.action_states, since=since, until=until, now=now, reason=reason
        )


def known_receiver(app: App, ident: str) -> Receiver:
    """The receiver configured, or only remembered by a row, as ``ident``; else :class:`Missing`."""
    configured = configured_receivers(app.config)
    if ident in configured:
        return configured[ident]
    with reading(app) as conn:
        rows = receivers.some(conn, [ident])
    if not rows:
        raise Missing(f"No receiver {ident!r} (GET /receivers lists them).")
    return Receiver(
        rows[0].id, rows[0].origin, policy_for(app.config.receivers, rows[0].origin), ()
    )
