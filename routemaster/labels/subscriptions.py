"""Where the API may let a push subscription send: the service-side check of a URL.

The API never reaches outbound HTTP itself; storing a subscription asks this
service whether its URL is one the workers may call (scheme, no userinfo, and
no address inside the network unless ``subscriptions: allow`` names its
origin). The workers check again on every connection they open
(:class:`routemaster.http.guard.GuardedAdapter`).
"""

from __future__ import annotations

from routemaster.app import App
from routemaster.http.guard import AddressPolicy, url_problem


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
