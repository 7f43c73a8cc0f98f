"""Request schemas compiled once into plain Python checks, so a valid request costs little.

jsonschema's validators walk the schema, keyword by keyword, on every call:
about 25-50 µs for the two-key body of a label update on our machines, a
twentieth of what serving the update costs. A schema using only the keywords
below is compiled once into nested closures answering "valid" or "look
closer". A request they pass is valid; one they do not is checked again by
the full validator, which finds the error and words it. So a compiled check
may only ever be stricter than the validator, never more lenient: a keyword
it does not know (``if``, ``not``, ``oneOf``...) leaves the schema not
compiled, and the full validator alone decides, as it does for every
refusal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]
"""A compiled schema: ``True`` when the value is valid, ``False`` when the validator must look."""

ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "example", "deprecated", "$comment"}
)
"""Keywords that say nothing about validity (nor do ``x-...`` extensions)."""

_REF_PREFIX = "#/components/schemas/"


def _is_integer(value: object) -> bool:
    """JSON Schema's integers as the validator reads them: 3 and 3.0, never true or false."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_TYPES: Mapping[str, Check] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
}


def compile_check(
    schema: Mapping[str, Any],
    components: Mapping[str, Mapping[str, Any]],
    formats: Mapping[str, Check],
) -> Check | None:
    """``schema`` as a :data:`Check`, or ``None`` when it uses a keyword not compiled here.

    ``components`` resolves ``$ref``; ``formats`` are the formats the validator
    asserts (any other ``format`` is an annotation to it, and so here).
    """
    return _Compiler(components, formats).compile(schema)


class _Compiler:
    def __init__(
        self, components: Mapping[str, Mapping[str, Any]], formats: Mapping[str, Check]
    ) -> None:
        self._components = components
        self._formats = formats
        self._references: dict[str, Check | None] = {}
        self._open: set[str] = set()  # references being compiled (a cycle is not compiled)

    def compile(self, schema: object) -> Check | None:
        if not isinstance(schema, Mapping):
            return None  # boolean schemas: rare enough for the validator
        checks: list[Check] = []
        for keyword, value in schema.items():
            if keyword in ANNOTATIONS or keyword.startswith("x-"):
                continue
            check = self._keyword(keyword, value, schema)
            if check is None:
                return None
            checks.append(check)
        if len(checks) == 1:
            return checks[0]
        every = tuple(checks)
        return lambda value: all(check(value) for check in every)

    def _keyword(self, keyword: str, value: Any, schema: Mapping[str, Any]) -> Check | None:
        if keyword == "type":
            kinds = [value] if isinstance(value, str) else list(value)
            if not all(kind in _TYPES for kind in kinds):
                return None
            tests = tuple(_TYPES[kind] for kind in kinds)
            return tests[0] if len(tests) == 1 else lambda v: any(test(v) for test in tests)
        if keyword == "properties":
            return self._properties(value)
        if keyword == "required":
            names = tuple(value)
            return lambda v: not isinstance(v, dict) or all(name in v for name in names)
        if keyword == "additionalProperties":
            return self._additional(value, schema)
        if keyword == "items":
            item = self.compile(value)
            if item is None:
                return None
            return lambda v: not isinstance(v, list) or all(item(each) for each in v)
        if keyword in _BOUNDS:
            return _bound(keyword, value)
        if keyword == "pattern":
            search = re.compile(value).search
            return lambda v: not isinstance(v, str) or search(v) is not None
        if keyword == "format":
            asserted = self._formats.get(value)
            return asserted if asserted is not None else (lambda v: True)
        if keyword in ("enum", "const"):
            return _one_of(value if keyword == "enum" else [value])
        if keyword == "$ref":
            return self._reference(value)
        if keyword in ("anyOf", "allOf"):
            choices = [self.compile(choice) for choice in value]
            if any(choice is None for choice in choices):
                return None
            found = tuple(c for c in choices if c is not None)
            if keyword == "anyOf":
                return lambda v: any(choice(v) for choice in found)
            return lambda v: all(choice(v) for choice in found)
        return None

    def _properties(self, properties: Mapping[str, Any]) -> Check | None:
        compiled = [(name, self.compile(schema)) for name, schema in properties.items()]
        if any(check is None for _, check in compiled):
            return None
        pairs = tuple((name, check) for name, check in compiled if check is not None)
        return lambda v: (
            not isinstance(v, dict) or all(name not in v or check(v[name]) for name, check in pairs)
        )

    def _additional(self, value: Any, schema: Mapping[str, Any]) -> Check | None:
        known = frozenset(schema.get("properties", {}))
        if value is True:
            return lambda v: True
        if value is False:
            return lambda v: not isinstance(v, dict) or known.issuperset(v)
        extra = self.compile(value)
        if extra is None:
            return None
        return lambda v: (
            not isinstance(v, dict)
            or all(extra(item) for name, item in v.items() if name not in known)
        )

    def _reference(self, target: str) -> Check | None:
        if not target.startswith(_REF_PREFIX):
            return None
        name = target.removeprefix(_REF_PREFIX)
        if name in self._references:
            return self._references[name]
        if name in self._open or name not in self._components:
            return None
        self._open.add(name)
        self._references[name] = self.compile(self._components[name])
        self._open.discard(name)
        return self._references[name]


_BOUNDS: Mapping[str, tuple[Check, Callable[[Any], float], Callable[[float, Any], bool]]] = {
    "minimum": (_is_number, lambda v: v, lambda n, limit: n >= limit),
    "maximum": (_is_number, lambda v: v, lambda n, limit: n <= limit),
    "exclusiveMinimum": (_is_number, lambda v: v, lambda n, limit: n > limit),
    "exclusiveMaximum": (_is_number, lambda v: v, lambda n, limit: n < limit),
    "minLength": (lambda v: isinstance(v, str), len, lambda n, limit: n >= limit),
    "maxLength": (lambda v: isinstance(v, str), len, lambda n, limit: n <= limit),
    "minItems": (lambda v: isinstance(v, list), len, lambda n, limit: n >= limit),
    "maxItems": (lambda v: isinstance(v, list), len, lambda n, limit: n <= limit),
    "minProperties": (lambda v: isinstance(v, dict), len, lambda n, limit: n >= limit),
    "maxProperties": (lambda v: isinstance(v, dict), len, lambda n, limit: n <= limit),
}


def _bound(keyword: str, limit: Any) -> Check:
    """A keyword bounding a size or a number; it holds for values of other types."""
    applies, measure, within = _BOUNDS[keyword]
    return lambda v: not applies(v) or within(measure(v), limit)


def _one_of(allowed: list[Any]) -> Check:
    """``enum``/``const``: text and null compared here; other values left to the validator.

    (Python's ``==`` says ``True == 1`` and JSON Schema does not, so only
    values whose equality is the same in both are decided here.)
    """
    plain = frozenset(each for each in allowed if each is None or isinstance(each, str))
    return lambda v: (v is None or isinstance(v, str)) and v in plain
