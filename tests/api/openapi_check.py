"""Checking real responses against the API's own OpenAPI document.

The API tests' client (``conftest.client``) runs every response it gets
through :func:`check_response`, so a handler that answers something its
document does not describe fails the test that saw it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import flask
import jsonschema
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from routemaster.api.openapi import build_document


class Mismatch(AssertionError):
    """A response the document does not describe."""


def find_operation(
    document: dict[str, Any], method: str, raw_path: str
) -> tuple[str, dict[str, Any]] | None:
    """The path template and operation a raw (percent-encoded) path and method match."""
    segments = raw_path.split("/")
    for template, item in document["paths"].items():
        parts = template.split("/")
        if len(parts) != len(segments):
            continue
        if all(
            part == segment or (part.startswith("{") and part.endswith("}") and segment)
            for part, segment in zip(parts, segments, strict=True)
        ):
            operation = item.get(method.lower())
            if operation is not None:
                return template, operation
    return None


def check_response(
    document: dict[str, Any],
    method: str,
    raw_path: str,
    status: int,
    content_type: str | None,
    body: bytes,
) -> None:
    """Raise :class:`Mismatch` unless the document describes this response."""
    method = "GET" if method == "HEAD" else method
    found = find_operation(document, method, raw_path)
    if found is None:
        # Paths and methods the document lacks may only be refused as JSON errors.
        if status not in (401, 404, 405):
            raise Mismatch(f"{method} {raw_path} answered {status} but is not in the document")
        _validate(document, {"$ref": "#/components/schemas/Error"}, _json(body), method, raw_path)
        return
    template, operation = found
    responses = operation["responses"]
    response = responses.get(str(status)) or responses.get("default")
    if response is None:
        raise Mismatch(f"{method} {template}: status {status} is not documented")
    content = response.get("content")
    if not content:
        if body:
            raise Mismatch(f"{method} {template} {status}: documented without a body, got one")
        return
    media = (content_type or "").split(";")[0].strip()
    if media not in content:
        raise Mismatch(f"{method} {template} {status}: content type {media!r} not in {[*content]}")
    if media == "application/json" and method != "HEAD":
        _validate(document, content[media]["schema"], _json(body), method, template)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as error:
        raise Mismatch(f"not JSON: {body[:200]!r}") from error


def _validate(
    document: dict[str, Any], schema: dict[str, Any], value: Any, method: str, where: str
) -> None:
    root = {**schema, "components": document["components"]}
    errors = sorted(
        jsonschema.Draft202012Validator(root).iter_errors(value), key=lambda e: list(e.path)
    )
    if errors:
        details = "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:3])
        raise Mismatch(f"{method} {where}: body does not match the document: {details}")


class CheckedClient(FlaskClient):
    """A test client that checks every response against the app's OpenAPI document."""

    def open(self, *args: Any, **kwargs: Any) -> TestResponse:
        response = super().open(*args, **kwargs)
        request = response.request
        raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or request.path
        app = self.application
        assert isinstance(app, flask.Flask)
        with app.app_context():
            document = build_document(app)
        if response.is_streamed:
            body = b"".join(response.iter_encoded())
            response.response = iter([body])  # still a stream for the test that reads it
        else:
            body = response.get_data()
        check_response(
            document,
            request.method,
            urlsplit(raw).path,
            response.status_code,
            response.content_type,
            body,
        )
        return response
