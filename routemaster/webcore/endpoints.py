"""Each endpoint says, next to its handler, who may call it and what it answers.

One declaration serves two readers: authentication (:mod:`routemaster.api.auth`)
takes the scope from it, and the OpenAPI document (:mod:`routemaster.api.openapi`)
is built from it. ``create_app`` refuses a handler without one, so an
endpoint cannot be added without deciding its scope and documenting it::

    @blueprint.get("/changes")
    @endpoint(READ, "The changes stream", {200: Reply("Changes", EVENT_STREAM)})
    def changes() -> flask.Response: ...

Statuses not listed are still documented as the JSON error body, so only
the statuses a client should branch on need listing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

JSON = "application/json"
TEXT = "text/plain"
EVENT_STREAM = "text/event-stream"
HTML = "text/html"

CONSOLE = "console"
"""The tag of the console's pages: their errors are pages too (JSON when the database fails)."""

OPEN = None
"""The scope of an endpoint anyone may call, even with tokens required (``GET /``, ``/metrics``)."""

CAPABILITY = "capability"
"""The scope of an endpoint whose path holds an unguessable id that is itself the permission
(``/tasks/{id}/complete``): no token is needed, and a valid token is accepted."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Reply:
    """A response: a schema name from :mod:`routemaster.webcore.schemas` (``None``: no body)."""

    schema: str | None
    media_type: str = JSON
    description: str = ""


@dataclass(frozen=True)
class Query:
    """A query-string parameter."""

    name: str
    schema: Mapping[str, Any]
    description: str


@dataclass(frozen=True)
class Endpoint:
    scope: str | None
    summary: str
    replies: Mapping[int, Reply]
    body: str | None = None  # request body schema name, JSON
    body_required: bool = True
    query: tuple[Query, ...] = ()
    tags: tuple[str, ...] = field(default_factory=tuple)
    # (body key, scope): a body with this key also needs a token with this scope (checked
    # by the handler, which has parsed the body: :func:`routemaster.api.auth.require_scope`)
    scope_with: tuple[str, str] | None = None
    # Schemas of path parameters that are more than any text (``{"type": "string"}``).
    path: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


_ATTRIBUTE = "routemaster_endpoint"


def endpoint(
    scope: str | None,
    summary: str,
    replies: Mapping[int, Reply],
    *,
    body: str | None = None,
    body_required: bool = True,
    query: tuple[Query, ...] = (),
    tags: tuple[str, ...] = (),
    scope_with: tuple[str, str] | None = None,
    path: Mapping[str, Mapping[str, Any]] | None = None,
) -> Callable[[F], F]:
    """Declare a handler's scope (or :data:`OPEN`), summary, replies and inputs."""
    declared = Endpoint(
        scope, summary, replies, body, body_required, query, tags, scope_with, path or {}
    )

    def mark(view: F) -> F:
        setattr(view, _ATTRIBUTE, declared)
        return view

    return mark


def declared(view: Callable[..., Any] | None) -> Endpoint | None:
    return getattr(view, _ATTRIBUTE, None) if view is not None else None
