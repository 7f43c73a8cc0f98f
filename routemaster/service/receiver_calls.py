"""One call to a receiver outside the label claims (a subscription's batch, say).

The two halves of what the worker does for its own deliveries, for any
caller that sends one request at a time to a URL:

- :func:`acquire` before the call: :class:`Allowed` when the receiver may be
  called now (and, for a receiver with a rate, that call is counted), or the
  time to ask again (paused, ``Retry-After``, an open circuit, the rate).
  When the circuit's cooldown is over, the caller gets the one probe.
- :func:`record_call` after it, in the caller's own short transaction (the
  one that records what the call meant, e.g. a cursor moving on): the
  delivery log's entry, and the call counted for or against the receiver.

Waiting costs the caller nothing but asking again; nothing counts as an
attempt until a call is made. ``max_in_flight`` applies to the label claims
only: such a caller sends one request at a time.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.origins import Receiver, receiver_for_url
from routemaster.db import deliveries, receivers
from routemaster.db.deliveries import Delivery
from routemaster.http.calls import Call
from routemaster.service.delivery_claims import next_rate_at, rate_allows
from routemaster.service.delivery_outcomes import observe
from routemaster.service.transactions import writing


@dataclass(frozen=True)
class Allowed:
    receiver: Receiver
    probe: bool  # the circuit's one probe: a failure opens it again


def acquire(app: App, url: str) -> Allowed | datetime.datetime:
    """May ``url``'s receiver be called now? If not, when to ask again."""
    receiver = receiver_for_url(app.config, url)
    now = app.now()
    later = now + datetime.timedelta(seconds=app.settings.poll_interval)
    lease_until = now + app.settings.lease
    with writing(app) as conn:
        receivers.ensure(conn, [(receiver.id, receiver.origin)])
        [row] = receivers.some(conn, [receiver.id], lock=True)
        if row.paused:
            return later
        if row.not_before is not None and row.not_before > now:
            return row.not_before
        if row.circuit != "closed":
            if row.open_until is not None and row.open_until > now:
                return row.open_until
            if receivers.start_probe(conn, receiver.id, now=now, probe_until=lease_until):
                return Allowed(receiver, probe=True)
            return later
        rate = receiver.policy.rate
        if rate is not None:
            allowed, wake_at = rate_allows(rate, row.rate_at, now)
            if allowed <= 0:
                return wake_at
            receivers.set_rate_at(conn, {receiver.id: next_rate_at(rate, row.rate_at, now, 1)})
    return Allowed(receiver, probe=False)


def record_call(
    conn: sa.Connection,
    app: App,
    allowed: Allowed,
    call: Call,
    *,
    kind: str = "subscription",
    trigger: str = "scheduled",
    attempt: int | None = None,
    state_machine: str | None = None,
    label: str | None = None,
    state: str | None = None,
) -> Delivery:
    """Log the call and count it for or against its receiver, in ``conn``'s transaction."""
    entry = deliveries.entry_for(
        call,
        kind=kind,
        receiver=allowed.receiver.id,
        trigger="probe" if allowed.probe else trigger,
        attempt=attempt,
        state_machine=state_machine,
        label=label,
        state=state,
    )
    deliveries.record(conn, [entry])
    now = app.now()
    if call.receiver_failed:
        circuit = allowed.receiver.policy.circuit
        receivers.failed(
            conn,
            receivers.Failure(
                receiver=allowed.receiver.id,
                at=now,
                error=call.error or f"status {call.status}",
                counted=True,
                probe=allowed.probe,
                threshold=circuit.failures,
                reopen_at=now + circuit.cooldown,
                retry_until=None if call.retry_after is None else now + call.retry_after,
            ),
        )
    elif call.status is not None:
        receivers.succeeded(conn, [allowed.receiver.id], now=now)
    observe(app, entry)
    return entry
