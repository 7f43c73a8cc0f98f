"""Requests checked against the declaration the OpenAPI document is made from.

A handler asks for :func:`checked_query` and :func:`checked_body`; both look
up the handler's own :func:`~routemaster.webcore.endpoints.endpoint` declaration,
as :func:`check_path` does for every request's path parameters (a hook run
before every handler, after the token check),
and validate with the very schemas ``/openapi.json`` publishes, so whatever
the document says a request may hold is what the server accepts, and nothing
else. What JSON Schema cannot say (a state the machine has, a time in the
future, an address outside the network) stays in the handlers and the service.

Refusals are 400s whose message names the field and the rule. A schema may
carry its own message as ``x-error`` (an OpenAPI extension keyword, ignored
by validators), used when it or a schema inside it fails.

A body declared as an object is an object: JSON ``null`` is refused like any
other wrong type; only an empty body stands for "no body" where the body is
optional.

Path parameters: the schema the declaration gives the parameter (``path=``),
else the one every parameter of that name has (:data:`PATH_PARAMETERS`: a
``label`` is a ``LabelName``), else any text (a non-negative integer for an
``int`` converter).

Query strings: an empty value (``?state=``) is the same as leaving the
parameter out, for every parameter (the document says so); a parameter the
endpoint does not take, or one given twice, is refused. Integers and booleans
(``true``/``false``, also ``1``/``0``) are converted before validation.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import flask
import jsonschema
from jsonschema.exceptions import ValidationError, best_match
from werkzeug.exceptions import BadRequest
from werkzeug.routing import IntegerConverter

from routemaster.webcore.bodies import NO_BODY, json_body
from routemaster.webcore.child_schemas import CHILD_SCHEMAS
from routemaster.webcore.endpoints import Endpoint, Query, declared
from routemaster.webcore.flow_schemas import FLOW_SCHEMAS
from routemaster.webcore.schema_checks import Check, compile_check
from routemaster.webcore.schemas import (
    OUTBOUND_SCHEMAS,
    SCHEMAS,
    TASK_SCHEMAS,
    UNTIL_REFUSED,
    Schema,
    ref,
)

COMPONENTS: Mapping[str, Schema] = {
    **SCHEMAS,
    **OUTBOUND_SCHEMAS,
    **TASK_SCHEMAS,
    **FLOW_SCHEMAS,
    **CHILD_SCHEMAS,
}
"""Every schema the OpenAPI document has, by name."""

PATH_PARAMETERS: Mapping[str, Schema] = {"label": ref("LabelName")}
"""The schema of every path parameter of that name, unless its declaration says otherwise."""

EMPTY_QUERY_VALUES = "An empty query value (`?name=`) is the same as leaving the parameter out."
_INTEGER = re.compile(r"-?[0-9]{1,30}")
_PARAMETER = re.compile(r"<(?:([^:<>]+):)?([^<>]+)>")


class InvalidRequest(BadRequest):
    """A request outside its endpoint's declaration: a 400 naming the field and the rule."""

    def __init__(self, message: str, field: str | None = None, rule: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule  # the JSON Schema keyword that failed


def checked_query() -> dict[str, Any]:
    """The current request's query parameters, converted and checked; empty ones left out."""
    checks = _query_checks(_view())
    parameters = checks.parameters
    values: dict[str, Any] = {}
    args = flask.request.args
    for name in args:
        if name not in parameters:
            known = ", ".join(sorted(parameters)) or "none"
            raise InvalidRequest(
                f"Unknown query parameter {name!r} (this endpoint takes: {known})."
            )
        given = args.getlist(name)
        if len(given) > 1:
            raise InvalidRequest(f"Query parameter {name!r} is given more than once.")
        if "\x00" in given[0]:
            raise InvalidRequest(f"Query parameter {name!r} must not contain NUL characters.")
        if given[0] != "":
            values[name] = _converted(given[0], parameters[name].schema)
    if checks.passes is None or not checks.passes(values):
        error = best_match(checks.validator.iter_errors(values))
        if error is not None:
            raise InvalidRequest(_message(error, quoted=False), _field_of(error), error.validator)
    return values


def check_path() -> None:
    """The current request's path parameters checked against its declaration (a hook)."""
    view = flask.current_app.view_functions.get(flask.request.endpoint or "")
    values = flask.request.view_args
    rule = flask.request.url_rule
    if not values or view is None or rule is None or declared(view) is None:
        return
    checks = _path_checks(view, rule.rule)
    if checks.passes is None or not checks.passes(values):
        error = best_match(checks.validator.iter_errors(values))
        if error is not None:
            raise InvalidRequest(_message(error, quoted=False), _field_of(error), error.validator)


def path_schema(declaration: Endpoint, name: str, *, integer: bool) -> Schema:
    """The schema of the path parameter ``name`` of a route with this declaration."""
    if name in declaration.path:
        return dict(declaration.path[name])
    if name in PATH_PARAMETERS:
        return dict(PATH_PARAMETERS[name])
    if integer:
        return {"type": "integer", "minimum": 0}
    return {"type": "string"}


def checked_body(*, optional: bool = False, wrapper_levels: int = 0) -> Any:
    """The current request's JSON body, parsed within the limits and checked.

    With ``optional`` (the declaration's ``body_required=False``), an empty
    body is ``None``; a ``null`` body is checked like any other value.
    """
    declaration = declared(_view())
    assert declaration is not None and declaration.body is not None, "no body declared"
    body = json_body(optional=optional, wrapper_levels=wrapper_levels)
    if body is NO_BODY:
        return None
    return checked_value(declaration.body, body)


def checked_value(schema_name: str, value: Any) -> Any:
    """``value`` if the named request schema accepts it (3.0 as 3 where integers are due)."""
    checks = _body_checks(schema_name)
    if checks.passes is None or not checks.passes(value):
        error = best_match(checks.validator.iter_errors(value))
        if error is not None:
            raise InvalidRequest(_message(error, quoted=True), _field_of(error), error.validator)
    if not checks.integers:
        return value
    return _integers(value, checks.validator.schema, checks.validator.schema)


def aware_time(raw: str | None) -> datetime.datetime | None:
    """``until`` of a pause: an ISO-8601 time with its UTC offset (checked as ``date-time``)."""
    if raw is None:
        return None
    if datetime.datetime.fromisoformat(raw).tzinfo is None:
        raise InvalidRequest(UNTIL_REFUSED, "until", "format")
    return utc_time(raw)


def utc_time(raw: str) -> datetime.datetime:
    """A time checked as ``format: date-time``, in UTC (taken as UTC when it names no offset).

    In UTC because PostgreSQL refuses offsets past 15:59 that ISO 8601 allows; a
    moment past the ends of the calendar once in UTC is the end it passed.
    """
    moment = datetime.datetime.fromisoformat(raw)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    try:
        return moment.astimezone(datetime.UTC)
    except OverflowError:
        end = datetime.datetime.min if moment.year == 1 else datetime.datetime.max
        return end.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class _Checks:
    """One schema made ready once: its validator, its compiled check, what else it needs."""

    validator: Any
    passes: Check | None  # None: not compiled (the validator decides every request)
    integers: bool  # whether it declares an integer anywhere (3.0 read as 3)
    parameters: Mapping[str, Query] = field(default_factory=dict)  # by name (query strings)


def _view() -> Callable[..., Any]:
    view: Callable[..., Any] = flask.current_app.view_functions[flask.request.endpoint or ""]
    return view


def _converted(raw: str, schema: Mapping[str, Any]) -> Any:
    """A query value as the type its schema names (unchanged when it is not one)."""
    kinds = _types(schema)
    if "integer" in kinds and _INTEGER.fullmatch(raw):
        return int(raw)
    if "boolean" in kinds and raw.lower() in ("true", "1", "false", "0"):
        return raw.lower() in ("true", "1")
    return raw


def _types(schema: Mapping[str, Any]) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind or ())


def _is_time(value: object) -> bool:
    """RFC 3339 date-times, and what else ``datetime.fromisoformat`` reads (the server's parser)."""
    if not isinstance(value, str):
        return True
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


_FORMATS: Mapping[str, Check] = {"date-time": _is_time}
"""The formats requests are checked for (others are annotations)."""


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, check in _FORMATS.items():
        checker.checks(name)(check)
    return checker


def _integer(checker: Any, instance: object) -> bool:
    """JSON Schema's integers: 3 and 3.0 alike, never true or false."""
    return not isinstance(instance, bool) and (
        isinstance(instance, int) or (isinstance(instance, float) and instance.is_integer())
    )


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _integer),
)


@functools.cache
def _body_checks(name: str) -> _Checks:
    root = {**ref(name), "components": {"schemas": COMPONENTS}}
    validator = _Validator(root, format_checker=_format_checker())
    passes = compile_check(ref(name), COMPONENTS, _FORMATS)
    return _Checks(validator, passes, _declares_integer(root, root))


@functools.cache
def _query_checks(view: Callable[..., Any]) -> _Checks:
    """Per endpoint (its view function, the same in every app): its query parameters' checks."""
    declaration = declared(view)
    assert declaration is not None, "every route has a declaration"
    parameters = declaration.query
    schema = {"type": "object", "properties": {q.name: dict(q.schema) for q in parameters}}
    validator = _Validator(schema, format_checker=_format_checker())
    passes = compile_check(schema, COMPONENTS, _FORMATS)
    by_name = {q.name: q for q in parameters}
    return _Checks(validator, passes, _declares_integer(schema, schema), by_name)


@functools.cache
def _path_checks(view: Callable[..., Any], rule: str) -> _Checks:
    """Per route (its view and its rule, the same in every app): its path parameters' checks."""
    declaration = declared(view)
    assert declaration is not None
    converters = flask.current_app.url_map.converters
    schema = {
        "type": "object",
        "properties": {
            name: path_schema(
                declaration, name, integer=issubclass(converters.get(kind, str), IntegerConverter)
            )
            for kind, name in _PARAMETER.findall(rule)
        },
    }
    validator = _Validator(
        {**schema, "components": {"schemas": COMPONENTS}}, format_checker=_format_checker()
    )
    passes = compile_check(schema, COMPONENTS, _FORMATS)
    return _Checks(validator, passes, False)


def _declares_integer(schema: Any, root: Schema, seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``integer`` is a type anywhere in ``schema`` (through its references)."""
    if isinstance(schema, list):
        return any(_declares_integer(each, root, seen) for each in schema)
    if not isinstance(schema, dict):
        return False
    target = schema.get("$ref")
    if (
        isinstance(target, str)
        and target not in seen
        and _declares_integer(_resolved(schema, root), root, seen | {target})
    ):
        return True
    if "integer" in _types(schema):
        return True
    return any(
        _declares_integer(value, root, seen)
        for key, value in schema.items()
        if key not in ("enum", "const", "default", "examples", "example", "components")
    )


def _integers(value: Any, schema: Schema, root: Schema) -> Any:
    """``value`` with 3.0 as 3 wherever an integer is declared, so handlers see ``int``."""
    schema = _resolved(schema, root)
    if isinstance(value, float) and "integer" in _types(schema):
        return int(value)
    for choice in schema.get("anyOf", ()):
        value = _integers(value, choice, root)
    if isinstance(value, dict):
        for name, declared_schema in schema.get("properties", {}).items():
            if name in value:
                value[name] = _integers(value[name], declared_schema, root)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_integers(item, schema["items"], root) for item in value]
    return value


def _resolved(schema: Schema, root: Schema) -> Schema:
    target = schema.get("$ref")
    if not isinstance(target, str):
        return schema
    found: Any = root
    for part in target.removeprefix("#/").split("/"):
        found = found[part]
    return _resolved(found, root)


def _message(error: ValidationError, *, quoted: bool) -> str:
    """What a person needs to fix the request: the field and the rule it breaks."""
    for failed in _lineage(error):
        own = failed.schema.get("x-error") if isinstance(failed.schema, dict) else None
        if isinstance(own, str):
            return own
    path = list(error.absolute_path)
    rule = error.validator
    schema = error.schema if isinstance(error.schema, dict) else {}
    instance: Any = error.instance
    if rule == "required":
        wanted: Any = error.validator_value
        missing = next(n for n in wanted if n not in instance)
        return f"{_field([*path, missing], quoted)} is required."
    if rule == "additionalProperties":
        known = list(schema.get("properties", {}))
        extra = sorted(set(instance) - set(known))
        where = "" if not path else f" in {_field(path, quoted)}"
        return f"Unknown field {extra[0]!r}{where} (expected: {', '.join(known)})."
    if rule in ("anyOf", "oneOf") and error.context:
        return f"{_field(path, quoted)} must be {_describe_any(schema[rule])}."
    return f"{_field(path, quoted)} must be {describe(schema)}."


def _field_of(error: ValidationError) -> str | None:
    """The top-level field at fault (the missing one, for a missing field)."""
    if error.absolute_path:
        return str(error.absolute_path[0])
    instance: Any = error.instance
    wanted: Any = error.validator_value
    if error.validator == "required" and isinstance(instance, dict):
        return next((n for n in wanted if n not in instance), None)
    return None


def _lineage(error: ValidationError) -> Iterable[ValidationError]:
    found: Any = error
    while found is not None:
        yield found
        found = found.parent


def _field(path: list[Any], quoted: bool) -> str:
    if not path:
        return "The request body"
    name = str(path[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])
    return f'"{name}"' if quoted else name


def _describe_any(choices: list[Schema]) -> str:
    return " or ".join(describe(choice) for choice in choices)


def describe(schema: Mapping[str, Any]) -> str:
    """A schema in words: "an integer from 1 to 100", "text of 1 to 200 characters"..."""
    target = schema.get("$ref")
    if isinstance(target, str):
        return describe(COMPONENTS[target.rpartition("/")[2]])
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of: " + ", ".join(
            "null" if value is None else str(value) for value in schema["enum"]
        )
    kinds = _types(schema)
    words = [_describe_type(kind, schema) for kind in sorted(kinds - {"null"})]
    if "null" in kinds:
        words.append("null")
    words = words or ["a value"]
    return " or ".join(words)


def _describe_type(kind: str, schema: Mapping[str, Any]) -> str:
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            return f"{noun} from {low:g} to {high:g}"
        if low is not None:
            return f"{noun} of at least {low:g}"
        return noun if high is None else f"{noun} of at most {high:g}"
    if kind == "string":
        if schema.get("format") == "date-time":
            return "an ISO 8601 time, such as 2026-11-24T12:00:00Z"
        low, high = schema.get("minLength"), schema.get("maxLength")
        if high is not None:
            return f"text of {low or 0} to {high} characters"
        if "pattern" in schema:
            return f"text matching {schema['pattern']}"
        return "non-empty text" if low else "text"
    if kind == "boolean":
        return "true or false"
    if kind == "array":
        most = schema.get("maxItems")
        noun = "a non-empty list" if schema.get("minItems") else "a list"
        return noun if most is None else f"{noun} of at most {most} items"
    return "a JSON object" if kind == "object" else f"of type {kind}"
