"""The configured extra headers (``webhooks:`` rules) that apply to a URL template."""

from __future__ import annotations

from routemaster.config.model import StateMachine
from routemaster.config.patterns import rule_matches


def headers_for(machine: StateMachine, template: str) -> dict[str, str]:
    """Headers of every rule whose ``match`` pattern is found in the URL *template*.

    The template is the URL as configured, before ``<label>`` is substituted,
    so a label name can never decide which rules (and secrets) apply. Rules
    apply in configuration order, so a later matching rule overrides a header
    set by an earlier one. The patterns were tried on these very templates
    when the configuration loaded, so the search is quick.
    """
    headers: dict[str, str] = {}
    for rule in machine.webhooks:
        if rule_matches(rule.match, template):
            headers.update(rule.headers)
    return headers
