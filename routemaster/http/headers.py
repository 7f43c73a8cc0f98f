"""The configured extra headers (``webhooks:`` rules) that apply to a URL."""

from __future__ import annotations

import re

from routemaster.config.model import StateMachine


def headers_for(machine: StateMachine, url: str) -> dict[str, str]:
    """Headers of every rule whose ``match`` regex is found in ``url``.

    Rules apply in configuration order, so a later matching rule overrides
    a header set by an earlier one.
    """
    headers: dict[str, str] = {}
    for rule in machine.webhooks:
        if re.search(rule.match, url):
            headers.update(rule.headers)
    return headers
