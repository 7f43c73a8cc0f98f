"""What a search expression's values become in SQL: constants, JSON, moments and conditions.

Every value of the exit-condition language, once a search has fixed ``now``,
is one of four kinds:

- :class:`Const`: known before the query runs (literals, ``system.now``,
  ``system.time``, and anything computed from them alone), folded in Python
  with the evaluator's own rules;
- :class:`Json`: a ``jsonb`` expression, SQL ``NULL`` for a missing path
  (``metadata.*``, and the label's name and states as JSON strings);
- :class:`Moment`: a ``timestamptz`` expression (``history.entered_state``);
- :class:`Cond`: a boolean expression that is never ``NULL`` (a condition
  used as a value).

SQL text here is made only of fixed fragments and bound parameters
(:class:`Params`, in the driver's ``%(name)s`` style the store's statements
use): no value or path from the expression is ever written into the text,
and no fragment has a literal ``%`` (it would have to be written ``%%``).
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass, field
from typing import Any

from routemaster.exit_conditions.compile_errors import ConditionSyntaxError
from routemaster.exit_conditions.nodes import Node
from routemaster.exit_conditions.values import truthy

EXACT_FLOATS = 2**53
"""Float literals must be smaller than this in magnitude: beyond it the database's
exact decimals and Python's binary floats could disagree about equality."""

NULL_JSON = "CAST('null' AS jsonb)"


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Json:
    sql: str


@dataclass(frozen=True)
class Moment:
    sql: str


@dataclass(frozen=True)
class Cond:
    sql: str


Operand = Const | Json | Moment | Cond

TRUE = Cond("TRUE")
FALSE = Cond("FALSE")


def boolean(value: bool) -> Cond:
    return TRUE if value else FALSE


@dataclass
class Params:
    """The bound parameters of one compiled search: ``%(w0)s``, ``%(w1)s``, ..."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)

    def bind(self, value: Any) -> str:
        name = f"w{len(self.values)}"
        self.values[name] = value
        return f"%({name})s"

    def path(self, segments: tuple[str, ...]) -> str:
        """``metadata`` at ``segments``: the same text an index on the path is built on."""
        return f"(metadata #> CAST({self.bind(list(segments))} AS text[]))"

    def json(self, value: Any, node: Node) -> str:
        """A JSON-able constant as a ``jsonb`` parameter."""
        return f"CAST({self.bind(json_text(value, self.source, node))} AS jsonb)"

    def text(self, value: str, node: Node) -> str:
        if "\x00" in value:
            raise self.refuse("A search string cannot contain a NUL character", node)
        return f"CAST({self.bind(value)} AS text)"

    def moment(self, value: datetime.datetime) -> str:
        return f"CAST({self.bind(value)} AS timestamptz)"

    def refuse(self, message: str, node: Node) -> ConditionSyntaxError:
        return refuse(message, self.source, node)


def refuse(message: str, source: str, node: Node) -> ConditionSyntaxError:
    """A 400 for something a search cannot answer exactly as a gate would, marking ``node``."""
    return ConditionSyntaxError(message, source, node.start, node.end)


def is_jsonable(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def json_text(value: Any, source: str, node: Node) -> str:
    """The JSON for a constant the database compares as the evaluator would, or a refusal."""
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) >= EXACT_FLOATS):
        raise refuse(
            f"A search compares numbers with a fraction only below {EXACT_FLOATS} "
            "in magnitude; write the number as an integer",
            source,
            node,
        )
    if isinstance(value, str) and "\x00" in value:
        raise refuse("A search string cannot contain a NUL character", source, node)
    return json.dumps(value)


def as_json(operand: Const | Json | Cond, params: Params, node: Node) -> Json:
    """A JSON-able operand as a ``jsonb`` expression (``NULL`` still meaning null)."""
    if isinstance(operand, Json):
        return operand
    if isinstance(operand, Cond):
        return Json(f"to_jsonb({operand.sql})")
    return Json(params.json(operand.value, node))


def json_type(sql: str) -> str:
    """The JSON type of a ``jsonb`` expression, ``'null'`` for SQL ``NULL``: never ``NULL``."""
    return f"COALESCE(jsonb_typeof({sql}), 'null')"


def json_string(sql: str) -> str:
    """The text of a JSON string, compared by code point whatever the database's collation."""
    return f"(({sql}) #>> CAST('{{}}' AS text[])) COLLATE \"C\""


def truth(operand: Operand) -> Cond:
    """What a value means as a condition (the evaluator's ``truthy``)."""
    if isinstance(operand, Cond):
        return operand
    if isinstance(operand, Moment):
        return Cond(f"({operand.sql} IS NOT NULL)")
    if isinstance(operand, Json):
        value = operand.sql
        return Cond(
            f"(CASE {json_type(value)}"
            f" WHEN 'boolean' THEN {value} = CAST('true' AS jsonb)"
            f" WHEN 'number' THEN {value} <> CAST('0' AS jsonb)"
            f" WHEN 'string' THEN {value} <> CAST('\"\"' AS jsonb)"
            f" WHEN 'array' THEN {value} <> CAST('[]' AS jsonb)"
            f" WHEN 'object' THEN {value} <> CAST('{{}}' AS jsonb)"
            " ELSE FALSE END)"
        )
    return boolean(truthy(operand.value))
