"""``subscriptions: allow``: the origins push subscriptions may reach inside the network (pure).

Each pattern is a regular expression searched in a subscription URL's
origin; it is checked at load like ``webhooks: match`` (size, syntax). The
model is :class:`~routemaster.config.model.SubscriptionsConfig`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from routemaster.config.patterns import pattern_problems
from routemaster.config.source import ConfigPath


def subscription_problems(document: Any) -> Iterator[tuple[ConfigPath, str]]:
    """Each unusable ``allow`` pattern, with its path."""
    section = document.get("subscriptions") if isinstance(document, dict) else None
    allow = section.get("allow") if isinstance(section, dict) else None
    for index, pattern in enumerate(allow if isinstance(allow, list) else []):
        if isinstance(pattern, str):
            for problem in pattern_problems(pattern, ()):
                yield ("subscriptions", "allow", index), problem
