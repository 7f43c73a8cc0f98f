"""Substituting a label and machine name into a configured URL template."""

from __future__ import annotations

from urllib.parse import quote


def render_url(template: str, *, label: str, state_machine: str) -> str:
    """``template`` with ``<label>`` and ``<state_machine>`` replaced, percent-encoded.

    Everything is encoded (``safe=""``), ``/``, ``?``, ``#`` and ``@``
    included, so a label name can only ever become one path segment or
    query value: it can never change the URL's host, path or query shape.
    """
    return template.replace("<label>", quote(label, safe="")).replace(
        "<state_machine>", quote(state_machine, safe="")
    )
