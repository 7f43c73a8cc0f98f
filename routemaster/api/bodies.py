"""Reading request bodies and query strings within the documented limits.

Every JSON body goes through :func:`json_body`: at most ``max_request_body``
bytes are read whether or not the client sent ``Content-Length`` (a chunked
body over the limit is a 413, not a truncated document), and the document is
parsed by :func:`routemaster.limits.parse_json` with ``max_json_depth``, so
nothing nested deeper than the limit, and no string PostgreSQL cannot store,
gets past the handler.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import flask
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from routemaster.api.extension import routemaster_app
from routemaster.limits import JSONRejected, parse_json


def raw_body() -> bytes:
    """The request body, or 413 once it passes ``max_request_body`` bytes."""
    limit = routemaster_app().settings.max_request_body
    request = flask.request
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        data = request.stream.read(limit + 1)
    except RequestEntityTooLarge:
        raise _too_large(limit) from None
    if len(data) > limit:
        raise _too_large(limit)
    return data


def json_body(*, optional: bool = False, wrapper_levels: int = 0) -> Any:
    """The decoded JSON body; 400 saying why when it is not acceptable JSON.

    With ``optional``, an empty body is ``None`` instead of an error.
    ``wrapper_levels`` are levels of envelope (``{"metadata": ...}``) not
    counted against the depth limit.
    """
    data = raw_body()
    if optional and not data.strip():
        return None
    try:
        return parse_json(
            data,
            max_depth=routemaster_app().settings.max_json_depth,
            wrapper_levels=wrapper_levels,
        )
    except JSONRejected as error:
        raise BadRequest(f"The request body is not acceptable JSON: {error}.") from None


def check_query(allowed: Collection[str]) -> None:
    """400 naming the first query parameter that is unknown, repeated or holds NUL."""
    args = flask.request.args
    for name in args:
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise BadRequest(f"Unknown query parameter {name!r} (this endpoint takes: {known}).")
        values = args.getlist(name)
        if len(values) > 1:
            raise BadRequest(f"Query parameter {name!r} is given more than once.")
        if "\x00" in values[0]:
            raise BadRequest(f"Query parameter {name!r} must not contain NUL characters.")


def _too_large(limit: int) -> RequestEntityTooLarge:
    return RequestEntityTooLarge(f"Request bodies are limited to {limit} bytes.")
