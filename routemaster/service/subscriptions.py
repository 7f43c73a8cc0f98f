"""Push subscriptions (SPEC D2) as the faces keep them: stored, read, deleted, rewound.

The API never reaches outbound HTTP itself; storing a subscription asks this
service whether its URL is one the workers may call (scheme, no userinfo, and
no address inside the network unless ``subscriptions: allow`` names its
origin). The workers check again on every connection they open
(:class:`routemaster.http.guard.GuardedAdapter`). A subscription is read with
its lag (:class:`Lag`), in the same transaction.
"""

from __future__ import annotations

import sqlalchemy as sa

from routemaster.app import App
from routemaster.db import subscriptions as store
from routemaster.db.changes import Position, present
from routemaster.db.subscriptions import Lag, Subscription, SubscriptionSettings
from routemaster.http.guard import AddressPolicy, url_problem
from routemaster.service.transactions import reading, write, writing

__all__ = [
    "ForbiddenDestination",
    "Invalid",
    "Lag",
    "Position",
    "Shown",
    "Subscription",
    "SubscriptionSettings",
    "all_subscriptions",
    "check_destination",
    "delete_subscription",
    "get_subscription",
    "put_subscription",
    "set_cursor",
]

Shown = tuple[Subscription, Lag]
"""A subscription and its lag, read together."""


class ForbiddenDestination(Exception):
    """The URL may not be sent to; ``reason`` tells a client which rule refused it."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_destination(app: App, url: str) -> None:
    """Raise :class:`ForbiddenDestination` unless the workers may POST batches to ``url``."""
    problem = url_problem(url, AddressPolicy(app.config.subscriptions.allow))
    if problem is not None:
        reason = "forbidden_address" if problem.inside_network else "invalid_url"
        raise ForbiddenDestination(problem.message, reason)


class Invalid(Exception):
    """A 400 with a machine-readable reason."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


def all_subscriptions(app: App) -> list[Shown]:
    with reading(app) as conn:
        return [_with_lag(app, conn, found) for found in store.all_subscriptions(conn)]


def get_subscription(app: App, name: str) -> Shown | None:
    with reading(app) as conn:
        found = store.get_subscription(conn, name)
        return None if found is None else _with_lag(app, conn, found)


def put_subscription(
    app: App, name: str, settings: SubscriptionSettings, *, after: Position | None
) -> tuple[Shown, bool]:
    """Create or replace (keeping its cursor unless ``after`` moves it); true when created."""
    with writing(app) as conn:
        if after is not None:
            _check_position(conn, after)
        subscription, created = store.put_subscription(conn, name, settings, after=after)
        return _with_lag(app, conn, subscription), created


delete_subscription = write(store.delete_subscription)


def set_cursor(app: App, name: str, after: Position) -> Shown | None:
    """Replay from ``after`` (superseding the batch in flight); ``None``: no such subscription."""
    with writing(app) as conn:
        _check_position(conn, after)
        found = store.set_cursor(conn, name, after)
        return None if found is None else _with_lag(app, conn, found)


def _with_lag(app: App, conn: sa.Connection, subscription: Subscription) -> Shown:
    return subscription, store.lag(conn, subscription, app.horizon)


def _check_position(conn: sa.Connection, after: Position) -> None:
    """A position ahead of the stream would skip changes not yet made: refused."""
    if after.xact > present(conn).xact:
        raise Invalid(f'"after": {after} is ahead of the changes stream.', "invalid_cursor")
