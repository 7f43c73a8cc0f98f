"""The shape of the configuration as a JSON Schema, and its errors as located problems.

The schema is data (Draft 2020-12, ``additionalProperties: false`` throughout),
so the accepted shape can be read in one place. ``x-messages`` is our own
annotation: the message to show when the named keyword fails, for the places
where a generic message would not tell the user what to write.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from routemaster.config.problems import ConfigProblem
from routemaster.config.receiver_rules import SCHEMA as RECEIVERS_SCHEMA
from routemaster.config.retention import SCHEMA as RETENTION_SCHEMA
from routemaster.config.source import ConfigPath, SourceMap

Schema = dict[str, Any]


def _object(properties: dict[str, Schema], *, required: tuple[str, ...] = ()) -> Schema:
    schema: Schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        schema["required"] = list(required)
    return schema


def _tagged(description: str, branches: dict[str, Schema]) -> Schema:
    """A mapping told apart by which key it has (``gate:``/``action:``, trigger kinds).

    An if/else chain rather than ``oneOf``, so a mistake is reported against the
    branch the user meant instead of as "not valid under any of the schemas".
    """
    chain: Schema = {
        "if": {"type": "object"},
        "then": {"not": {}, "x-messages": {"not": f"expected {description}"}},
    }
    for key, branch in reversed(branches.items()):
        chain = {"if": {"type": "object", "required": [key]}, "then": branch, "else": chain}
    return {"type": "object", "x-messages": {"type": f"expected {description}"}, **chain}


_NAME: Schema = {"type": "string", "minLength": 1}
_TEXT: Schema = {"type": "string"}
_DURATION: Schema = {
    "type": "string",
    "x-messages": {"type": "expected a duration such as 30s, 10m or 1h30m (as text)"},
}
_RETRY = _object(
    {
        "max_attempts": {"type": "integer", "minimum": 1},
        "initial_delay": _DURATION,
        "max_delay": _DURATION,
        "multiplier": {"type": "number", "minimum": 1},
        "timeout": _DURATION,
    }
)
_LEASE: Schema = {
    "if": {"type": "object"},
    "then": _object(
        {
            "percentile": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
            "min": _DURATION,
            "max": _DURATION,
        },
        required=("percentile", "min", "max"),
    ),
    "else": {
        "type": "string",
        "x-messages": {
            "type": "expected a duration such as 30s, or {percentile: 95, min: 10s, max: 10m}"
        },
    },
}
_METADATA_PATH: Schema = {
    "type": "string",
    "pattern": r"^metadata(\.[A-Za-z0-9_][A-Za-z0-9_-]*)+$",
    "x-messages": {
        "type": "expected a metadata path such as metadata.customer.id",
        "pattern": "expected a metadata path such as metadata.customer.id",
    },
}
_FLOW = _object(
    {
        "key": _METADATA_PATH,
        "concurrency": {
            "type": "integer",
            "minimum": 1,
            "x-messages": {
                "type": "expected a whole number of labels, at least 1",
                "minimum": "concurrency must be at least 1",
            },
        },
        "weight": _METADATA_PATH,
        "name": {
            "type": "string",
            "pattern": r"^[A-Za-z0-9_.-]+$",
            "x-messages": {"pattern": "a flow's name is letters, digits, '_', '.' and '-'"},
        },
    },
    required=("key",),
)
_TRIGGER = _tagged(
    "a trigger: one of metadata, interval, time or event",
    {
        "metadata": _object({"metadata": _TEXT}, required=("metadata",)),
        "interval": _object({"interval": _DURATION}, required=("interval",)),
        "time": _object(
            {
                "time": {
                    "type": "string",
                    "x-messages": {"type": 'expected a time of day such as 18h30m or "18:30"'},
                },
                "timezone": _TEXT,
            },
            required=("time",),
        ),
        "event": _object({"event": {"enum": ["entry", "timer"]}}, required=("event",)),
    },
)
_CONSTANT_NEXT = _object(
    {"type": {"const": "constant"}, "state": _TEXT}, required=("type", "state")
)
_CONTEXT_NEXT = _object(
    {
        "type": {"const": "context"},
        "path": _TEXT,
        "default": _TEXT,
        "destinations": {
            "type": "array",
            "items": _object({"value": {}, "state": _TEXT}, required=("value", "state")),
        },
    },
    required=("type", "path", "default", "destinations"),
)
_NEXT: Schema = {
    "type": ["string", "object"],
    "x-messages": {
        "type": "expected a state name, or a mapping with type: constant or type: context"
    },
    "if": {"type": "object"},
    "then": {
        "required": ["type"],
        "properties": {"type": {"enum": ["constant", "context"]}},
        "allOf": [
            {
                "if": {"properties": {"type": {"const": "constant"}}, "required": ["type"]},
                "then": _CONSTANT_NEXT,
            },
            {
                "if": {"properties": {"type": {"const": "context"}}, "required": ["type"]},
                "then": _CONTEXT_NEXT,
            },
        ],
    },
}
_OUTCOME: Schema = {
    "enum": ["succeeded", "failed"],
    "x-messages": {"enum": "expected succeeded or failed"},
}
_WAIT: Schema = {
    "if": {"type": "object"},
    "then": _object(
        {
            "at_least": {
                "type": "integer",
                "minimum": 1,
                "x-messages": {
                    "minimum": "at_least must be 1 or more",
                    "type": "expected a whole number of children, 1 or more",
                },
            }
        },
        required=("at_least",),
    ),
    "else": {
        "enum": ["all", "any"],
        "x-messages": {"enum": "expected all, any or {at_least: N}"},
    },
}
_STATE = _tagged(
    "a state: a mapping with a 'gate', an 'action' or a 'spawn' key",
    {
        "gate": _object(
            {
                "gate": _TEXT,
                "triggers": {"type": "array", "items": _TRIGGER},
                "exit_condition": {
                    "type": ["string", "boolean"],
                    "x-messages": {"type": "expected a condition (text), true or false"},
                },
                "next": _NEXT,
                "outcome": _OUTCOME,
            },
            required=("gate", "exit_condition"),
        ),
        "action": _object(
            {
                "action": _TEXT,
                "webhook": _TEXT,
                "worker": _object(
                    {"lease": _LEASE, "at_most_once": {"type": "boolean"}}, required=("lease",)
                ),
                "async_timeout": _DURATION,
                "flow": _FLOW,
                "next": _NEXT,
                "retry": _RETRY,
                "outcome": _OUTCOME,
            },
            required=("action",),
        ),
        "spawn": _object(
            {
                "spawn": _TEXT,
                "machine": _NAME,
                "for_each": _TEXT,
                "wait": _WAIT,
                "on_exit": {
                    "enum": ["keep", "delete"],
                    "x-messages": {"enum": "expected keep or delete"},
                },
                "next": _NEXT,
                "outcome": _OUTCOME,
            },
            required=("spawn", "machine", "for_each"),
        ),
    },
)
_MIGRATION_STATES = _object({"from": _NAME, "to": _NAME}, required=("from", "to"))
_MIGRATION = _tagged(
    "a migration: a mapping with a 'rename' or a 'move' key",
    {
        "rename": _object({"rename": _MIGRATION_STATES}, required=("rename",)),
        "move": _object({"move": _MIGRATION_STATES}, required=("move",)),
    },
)
_MACHINE = _object(
    {
        "feeds": {
            "type": "array",
            "items": _object({"name": _NAME, "url": _TEXT}, required=("name", "url")),
        },
        "webhooks": {
            "type": "array",
            "items": _object(
                {
                    "match": _TEXT,
                    "headers": {"type": "object", "additionalProperties": _TEXT},
                },
                required=("match", "headers"),
            ),
        },
        "states": {"type": "array", "minItems": 1, "items": _STATE},
        "search": {
            "type": "array",
            "maxItems": 32,
            "uniqueItems": True,
            "items": {
                "type": "string",
                "pattern": r"^metadata(\.[A-Za-z0-9_][A-Za-z0-9_-]*)+$",
                "x-messages": {
                    "type": "expected a metadata path to index, such as metadata.customer.id",
                    "pattern": "expected a metadata path to index, such as metadata.customer.id",
                },
            },
            "x-messages": {
                "maxItems": "at most 32 search paths per state machine",
                "uniqueItems": "each search path once",
            },
        },
        "migrations": {"type": "array", "items": _MIGRATION},
        "upgrade_strategy": {"enum": ["upgrade", "continue", "abort"]},
        "abort_to": _TEXT,
        "retry": _RETRY,
        "signing_secret": _NAME,
        "signing_secret_env": _NAME,
        "retention": RETENTION_SCHEMA,
    },
    required=("states",),
)

SCHEMA: Schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_object(
        {
            "state_machines": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {
                    "type": "string",
                    "minLength": 1,
                    "x-messages": {
                        "type": "a state machine's name must be text",
                        "minLength": "a state machine's name must not be empty",
                    },
                },
                "additionalProperties": _MACHINE,
            },
            "plugins": _object(
                {
                    "logging": {
                        "type": "array",
                        "items": _object(
                            {"class": _TEXT, "kwargs": {"type": "object"}}, required=("class",)
                        ),
                    }
                }
            ),
            "placeholders": {
                "type": "object",
                "additionalProperties": {"type": ["string", "number", "boolean"]},
            },
            "api": _object(
                {
                    "authentication": {"enum": ["none", "tokens"]},
                }
            ),
            "receivers": RECEIVERS_SCHEMA,
            "subscriptions": _object({"allow": {"type": "array", "items": _TEXT}}),
            "retention": RETENTION_SCHEMA,
        },
        required=("state_machines",),
    ),
}

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "text",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def schema_problems(document: Any, source: SourceMap) -> list[ConfigProblem]:
    """Every way ``document`` departs from :data:`SCHEMA`, each located in its file."""
    problems: list[ConfigProblem] = []
    for error in _VALIDATOR.iter_errors(document):
        path: ConfigPath = tuple(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = error.schema.get("properties", {})
            expected = ", ".join(allowed) if allowed else "none"
            for key in error.instance:
                if key not in allowed:
                    problems.append(
                        source.problem(
                            (*path, key), f"unknown key {key!r} (expected one of: {expected})"
                        )
                    )
            continue
        problems.append(source.problem(path, _message(error)))
    return problems


def _message(error: jsonschema.ValidationError) -> str:
    custom = error.schema.get("x-messages", {}) if isinstance(error.schema, dict) else {}
    if error.validator in custom:
        return f"{custom[error.validator]}, got {describe_value(error.instance)}"
    value: Any = error.validator_value
    if error.validator == "required":
        match = re.match(r"(.*) is a required property$", error.message)
        key = match.group(1) if match else repr(value)
        return f"missing required key {key}"
    if error.validator == "type":
        types = [value] if isinstance(value, str) else list(value)
        wanted = " or ".join(_TYPE_NAMES.get(name, name) for name in types)
        return f"expected {wanted}, got {describe_value(error.instance)}"
    if error.validator in ("enum", "const"):
        options = value if error.validator == "enum" else [value]
        wanted = " or ".join(repr(option) for option in options)
        return f"expected {wanted}, got {describe_value(error.instance)}"
    if error.validator in ("minItems", "minProperties", "minLength") and value == 1:
        return "must not be empty"
    if error.validator == "minimum":
        return f"must be at least {value}, got {describe_value(error.instance)}"
    return str(error.message)


def describe_value(value: Any) -> str:
    """How a wrong value is shown in a message: its kind, and the value when short."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        keys = ", ".join(str(key) for key in value)
        return f"a mapping with keys {keys}" if keys else "an empty mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int | float):
        return f"the number {value}"
    text = repr(value)
    return f"the text {text if len(text) <= 40 else text[:37] + '...'}"
