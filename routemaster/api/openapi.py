"""``GET /openapi.json``: the OpenAPI 3.1 document, built from the routes and their declarations.

Nothing here lists endpoints by hand: every Flask route contributes the
operation its handler declares (:mod:`routemaster.webcore.endpoints`), with the
schemas of :mod:`routemaster.webcore.schemas`. With ``api.authentication:
tokens`` the document has the bearer scheme, each operation's scope, and
the 401/403 answers. The test suite validates the document and checks every
response the API tests receive against it.
"""

from __future__ import annotations

import re
from typing import Any

import flask
from werkzeug.routing import IntegerConverter

from routemaster import __version__
from routemaster.auth import READ
from routemaster.webcore.endpoints import (
    CAPABILITY,
    CONSOLE,
    HTML,
    JSON,
    OPEN,
    Endpoint,
    Reply,
    declared,
    endpoint,
)
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.request_checks import COMPONENTS, EMPTY_QUERY_VALUES, path_schema
from routemaster.webcore.responses import json_response
from routemaster.webcore.schemas import Schema, ref

blueprint = flask.Blueprint("openapi", __name__)

SECURITY_SCHEME = "bearerToken"
_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_DESCRIPTIONS = {
    200: "OK",
    201: "Created",
    204: "No content",
    400: "The request is malformed; the message says how",
    401: "A bearer token is required, or the one given is unknown",
    403: "The token lacks the scope this endpoint needs",
    404: "No such state machine or label",
    409: "Conflict; the message says with what",
    410: "The label was deleted",
    503: "The database cannot be reached",
}


@blueprint.get("/openapi.json")
@endpoint(READ, "This document", {200: Reply(None, JSON, "An OpenAPI 3.1 document")})
def openapi_document() -> flask.Response:
    return json_response(build_document(flask.current_app))


def openapi_path(rule: str) -> str:
    """``/state-machines/<name:sm>`` -> ``/state-machines/{sm}``."""
    return _PARAMETER.sub(r"{\1}", rule)


def build_document(flask_app: flask.Flask) -> dict[str, Any]:
    tokens = routemaster_app().config.api.tokens_required
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(flask_app.url_map.iter_rules(), key=lambda r: r.rule):
        declaration = declared(flask_app.view_functions.get(rule.endpoint))
        if declaration is None:  # a plugin's route: not ours to describe
            continue
        methods = sorted(m.lower() for m in rule.methods or () if m not in {"HEAD", "OPTIONS"})
        path = openapi_path(rule.rule)
        for method in methods:
            operation_id = rule.endpoint.replace(".", "_")
            if len(methods) > 1:
                operation_id += "_" + method
            arguments = {
                name: path_schema(
                    declaration,
                    name,
                    integer=isinstance(rule._converters.get(name), IntegerConverter),
                )
                for name in rule.arguments
            }
            paths.setdefault(path, {})[method] = _operation(
                declaration, operation_id, arguments, tokens=tokens
            )
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "routemaster",
            "version": __version__,
            "description": "State machines as a service. Label names and machine names are "
            "percent-encoded path segments; a '/' inside a name travels as %2F. "
            "Requests are checked against this document: a body or query parameter outside it "
            "is a 400 whose message names the field and the rule. " + EMPTY_QUERY_VALUES + " "
            "Every body is also held to the server's limits (docs/limits.md): its size, its "
            "depth, and no string or key holding NUL (\\u0000) or an unpaired surrogate, "
            "which the database cannot store.",
        },
        "paths": {path: paths[path] for path in sorted(paths)},
        "components": {"schemas": dict(COMPONENTS)},
    }
    if tokens:
        document["components"]["securitySchemes"] = {
            SECURITY_SCHEME: {
                "type": "http",
                "scheme": "bearer",
                "description": "A secret from `routemaster token create`; the requirement of "
                "each operation names the scope it needs (read, write, operate or work); "
                "a task id in the path needs none.",
            }
        }
    return document


def _operation(
    declaration: Endpoint, operation_id: str, arguments: dict[str, Any], *, tokens: bool
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": declaration.summary,
        "responses": {},
    }
    if declaration.tags:
        operation["tags"] = list(declaration.tags)
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": arguments[name]}
        for name in sorted(arguments)
    ]
    parameters += [
        {
            "name": q.name,
            "in": "query",
            "schema": dict(q.schema),
            "description": q.description + " Empty: as if left out.",
            "allowEmptyValue": True,
        }
        for q in declaration.query
    ]
    if parameters:
        operation["parameters"] = parameters
    if declaration.body is not None:
        operation["requestBody"] = {
            "required": declaration.body_required,
            "content": {JSON: {"schema": ref(declaration.body)}},
        }
    replies = dict(declaration.replies)
    if tokens:
        operation["security"] = (
            [{}]
            if declaration.scope is OPEN
            else [{}, {SECURITY_SCHEME: []}]
            if declaration.scope == CAPABILITY and declaration.scope_with is None
            else [{}, {SECURITY_SCHEME: [declaration.scope_with[1]]}]
            if declaration.scope == CAPABILITY and declaration.scope_with is not None
            else [{SECURITY_SCHEME: [declaration.scope]}]
        )
        if declaration.scope_with is not None:
            key, scope = declaration.scope_with
            operation["description"] = (
                f"A body with `{key}` needs a token with the `{scope}` scope; "
                "without it, no token is needed."
            )
            replies.setdefault(401, Reply("Error", description=f"`{key}` without a valid token"))
            replies.setdefault(403, Reply("Error", description=f"The token lacks `{scope}`"))
        elif declaration.scope == CAPABILITY:
            replies.setdefault(401, Reply("Error", description="A token was sent and is not valid"))
        elif declaration.scope is not OPEN:
            replies.setdefault(401, Reply("Error"))
            replies.setdefault(403, Reply("Error"))
    for status in sorted(replies):
        operation["responses"][str(status)] = _response(status, replies[status])
    operation["responses"]["default"] = _response(0, Reply("Error", description="An error"))
    if CONSOLE in declaration.tags:
        operation["responses"]["default"] = {
            "description": "An error: a page, or JSON when the database failed",
            "content": {HTML: {"schema": {"type": "string"}}, JSON: {"schema": ref("Error")}},
        }
    return operation


def _response(status: int, reply: Reply) -> dict[str, Any]:
    description = reply.description or _DESCRIPTIONS.get(status, "See the message")
    response: dict[str, Any] = {"description": description}
    if reply.schema is not None or reply.media_type != JSON:
        schema: Schema = ref(reply.schema) if reply.schema else {}
        if reply.media_type != JSON and not reply.schema:
            schema = {"type": "string"}
        response["content"] = {reply.media_type: {"schema": schema}}
    elif status != 204:
        response["content"] = {JSON: {"schema": {"type": "object"}}}
    return response


def check_every_endpoint_is_declared(flask_app: flask.Flask) -> None:
    """Refuse to start with a handler that did not declare its scope and replies."""
    missing = sorted(
        rule.rule
        for rule in flask_app.url_map.iter_rules()
        if declared(flask_app.view_functions.get(rule.endpoint)) is None
    )
    if missing:
        raise RuntimeError(
            "endpoints without an @endpoint declaration (scope, replies): " + ", ".join(missing)
        )
