"""Substituting a label and machine name into a configured URL template."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}


def render_url(template: str, *, label: str, state_machine: str) -> str:
    """``template`` with ``<label>`` and ``<state_machine>`` replaced, percent-encoded.

    Everything is encoded (``safe=""``), ``/``, ``?``, ``#`` and ``@``
    included, so a name can only ever become one path segment or query
    value: it can never change the URL's host, path or query shape. A name
    that is a dot segment (``.`` or ``..``) has its dots written ``%2E``:
    left as they are, HTTP clients and servers resolve them and the
    receiver would see a shorter path.
    """
    return template.replace("<label>", _encoded(label)).replace(
        "<state_machine>", _encoded(state_machine)
    )


def _encoded(name: str) -> str:
    return _DOT_SEGMENTS.get(name) or quote(name, safe="")


def origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port (the default made explicit): what "the same server" means."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port
