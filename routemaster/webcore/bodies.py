"""Reading request bodies within the documented limits.

Every JSON body goes through :func:`json_body`: at most ``max_request_body``
bytes are read whether or not the client sent ``Content-Length`` (a chunked
body over the limit is a 413, not a truncated document), and the document is
parsed by :func:`routemaster.limits.parse_json` with ``max_json_depth``, so
nothing nested deeper than the limit, and no string PostgreSQL cannot store,
gets past the handler.
"""

from __future__ import annotations

from typing import Any

import flask
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from routemaster.app import Settings
from routemaster.limits import JSONRejected, parse_json
from routemaster.webcore.extension import routemaster_app

_CHUNK = 64 * 1024
NO_BODY: Any = object()
"""What an optional body is when the request has none (``null`` is a body: JSON's null)."""


def json_body(*, optional: bool = False, wrapper_levels: int = 0) -> Any:
    """The current request's decoded JSON body: :func:`parse_body` with the app's settings."""
    return parse_body(
        flask.request, routemaster_app().settings, optional=optional, wrapper_levels=wrapper_levels
    )


def read_body(request: flask.Request, limit: int) -> bytes:
    """The request body, or 413 once it passes ``limit`` bytes.

    A body without ``Content-Length`` (chunked) is read from the server's
    stream, which ends it (``wsgi.input_terminated``), up to one byte past
    the limit: enough to know it is too large without reading the rest.
    """
    length = request.content_length
    if length is not None:
        if length > limit:
            raise _too_large(limit)
        return request.get_data(cache=False)
    environ = request.environ
    if not environ.get("wsgi.input_terminated"):
        return b""  # a server that does not end streams: nothing can be read safely
    stream = environ["wsgi.input"]
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        try:
            chunk = stream.read(min(_CHUNK, limit + 1 - size))
        except Exception as error:  # the server's own framing errors (a bad chunk size, ...)
            raise BadRequest(f"The request body could not be read: {error}.") from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise _too_large(limit)
    return b"".join(chunks)


def parse_body(
    request: flask.Request, settings: Settings, *, optional: bool = False, wrapper_levels: int = 0
) -> Any:
    """The decoded JSON body; 400 saying why when it is not acceptable JSON.

    With ``optional``, an empty body is :data:`NO_BODY` instead of an error.
    ``wrapper_levels`` are levels of envelope (``{"metadata": ...}``) not
    counted against the depth limit.
    """
    data = read_body(request, settings.max_request_body)
    if optional and not data.strip():
        return NO_BODY
    try:
        return parse_json(data, max_depth=settings.max_json_depth, wrapper_levels=wrapper_levels)
    except JSONRejected as error:
        raise BadRequest(f"The request body is not acceptable JSON: {error}.") from None


def _too_large(limit: int) -> RequestEntityTooLarge:
    return RequestEntityTooLarge(f"Request bodies are limited to {limit} bytes.")
