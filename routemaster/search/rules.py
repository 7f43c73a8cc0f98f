"""The operators on search operands, with the evaluator's meaning (``exit_conditions.values``).

Each rule gives a condition that is never ``NULL``, so ``not`` means what it
means to a gate. Two constants are folded in Python by the evaluator itself.
Where the database cannot give the evaluator's answer for every value a
label might hold (a metadata string read as a time, a feed), the search is
refused with a message marking the clause, rather than answered differently.
"""

from __future__ import annotations

import datetime

from routemaster.exit_conditions import values
from routemaster.exit_conditions.nodes import Node
from routemaster.search.operands import (
    FALSE,
    NULL_JSON,
    Cond,
    Const,
    Json,
    Moment,
    Operand,
    Params,
    as_json,
    boolean,
    json_string,
    json_type,
)

FLIPPED = {"=": "=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
ORDERINGS = ("<", ">", "<=", ">=")
STRINGS_AS_TIMES = (
    "A search cannot compare metadata with a time: a gate reads ISO-8601 strings in "
    "metadata as times, the database does not. Compare history.entered_state, or "
    "compare the metadata with a string"
)


def negate(condition: Cond) -> Cond:
    if condition.sql in ("TRUE", "FALSE"):
        return boolean(condition.sql == "FALSE")
    return Cond(f"(NOT {condition.sql})")


def junction(word: str, operands: list[Cond]) -> Cond:
    """``and`` / ``or`` of conditions, with constant operands folded."""
    absorbing = "FALSE" if word == "AND" else "TRUE"
    kept = [operand for operand in operands if operand.sql not in ("TRUE", "FALSE")]
    if any(operand.sql == absorbing for operand in operands):
        return Cond(absorbing)
    if not kept:
        return Cond("TRUE" if word == "AND" else "FALSE")
    if len(kept) == 1:
        return kept[0]
    return Cond("(" + f" {word} ".join(operand.sql for operand in kept) + ")")


def compare(op: str, left: Operand, right: Operand, params: Params, node: Node) -> Cond:
    """``left op right`` for the six comparison operators."""
    if op == "/=":
        return negate(compare("=", left, right, params, node))
    if isinstance(left, Const) and isinstance(right, Const):
        return boolean(values.compare(op, left.value, right.value))
    if _rank(left) > _rank(right):
        left, right, op = right, left, FLIPPED[op]
    if isinstance(left, Moment):
        return _moment(op, left, right, params, node)
    if isinstance(left, Json):
        if isinstance(right, Moment):
            raise params.refuse(STRINGS_AS_TIMES, node)
        if isinstance(right, Const):
            return _json_with_constant(op, left, right.value, params, node)
        return _json_with_json(op, left, as_json(right, params, node))
    assert isinstance(left, Cond)
    if op != "=":
        return FALSE  # booleans are not ordered
    if isinstance(right, Cond):
        return Cond(f"({left.sql} = {right.sql})")
    if isinstance(right, Const) and isinstance(right.value, bool):
        return left if right.value else negate(left)
    return FALSE


def _rank(operand: Operand) -> int:
    """Comparisons put JSON and moments first, then conditions, then constants."""
    return 2 if isinstance(operand, Const) else 1 if isinstance(operand, Cond) else 0


def contains(container: Operand, item: Operand, params: Params, node: Node) -> Cond:
    """``item is in container``: a substring, a list element or a mapping key."""
    if isinstance(container, Const):
        if isinstance(item, Const):
            return boolean(values.contains(container.value, item.value))
        if isinstance(container.value, str) and isinstance(item, Json):
            return Cond(
                f"({json_type(item.sql)} = 'string'"
                f" AND strpos({params.text(container.value, node)}, {json_string(item.sql)}) > 0)"
            )
        return FALSE
    if not isinstance(container, Json):
        return FALSE  # a time or a boolean contains nothing
    if isinstance(item, Moment):
        raise params.refuse(STRINGS_AS_TIMES, node)
    if isinstance(item, Const):
        if isinstance(item.value, datetime.timedelta):
            return FALSE
        if isinstance(item.value, (datetime.datetime, datetime.time)):
            raise params.refuse(STRINGS_AS_TIMES, node)
    return Cond(f"routemaster_contains({container.sql}, {as_json(item, params, node).sql})")


def has_passed(
    duration: datetime.timedelta,
    since: Operand,
    now: datetime.datetime,
    params: Params,
    node: Node,
) -> Cond:
    """``duration has passed since since``: false unless ``since`` is a moment."""
    if isinstance(since, Const):
        return boolean(values.has_passed(duration, since.value, now))
    if isinstance(since, Json):
        raise params.refuse(STRINGS_AS_TIMES, node)
    if isinstance(since, Cond):
        return FALSE
    try:
        threshold = now - duration
    except OverflowError:  # longer ago than any moment: it cannot have passed
        return FALSE
    return Cond(f"COALESCE({since.sql} <= {params.moment(threshold)}, FALSE)")


def defined(operand: Operand) -> Cond:
    """``operand is defined``: it is not null (a missing path is null)."""
    if isinstance(operand, Const):
        return boolean(operand.value is not None)
    if isinstance(operand, Json):
        return Cond(f"({json_type(operand.sql)} <> 'null')")
    if isinstance(operand, Moment):
        return Cond(f"({operand.sql} IS NOT NULL)")
    return boolean(True)


def _moment(op: str, left: Moment, right: Operand, params: Params, node: Node) -> Cond:
    if isinstance(right, Moment):
        if op == "=":
            return Cond(f"({left.sql} IS NOT DISTINCT FROM {right.sql})")
        return Cond(f"COALESCE({left.sql} {op} {right.sql}, FALSE)")
    if isinstance(right, Json):
        raise params.refuse(STRINGS_AS_TIMES, node)
    if not isinstance(right, Const):
        return FALSE
    value = right.value
    if value is None:
        return Cond(f"({left.sql} IS NULL)") if op == "=" else FALSE
    moment = values.as_datetime(value)
    if isinstance(value, (str, datetime.datetime)) and moment is not None:
        return Cond(f"COALESCE({left.sql} {op} {params.moment(moment)}, FALSE)")
    return FALSE


def _json_with_constant(op: str, left: Json, value: object, params: Params, node: Node) -> Cond:
    if isinstance(value, (datetime.datetime, datetime.time)):
        raise params.refuse(STRINGS_AS_TIMES, node)
    if isinstance(value, datetime.timedelta):
        return FALSE  # no JSON value is a duration
    if op == "=":
        if value is None:
            return Cond(f"({json_type(left.sql)} = 'null')")
        # Both sides as the index on the path has them, so an equality search uses it.
        return Cond(f"({left.sql} IS NOT NULL AND {left.sql} = {params.json(value, node)})")
    if isinstance(value, str):
        return Cond(
            f"({json_type(left.sql)} = 'string'"
            f" AND {json_string(left.sql)} {op} {params.text(value, node)})"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Cond(
            f"({json_type(left.sql)} = 'number' AND {left.sql} {op} {params.json(value, node)})"
        )
    return FALSE  # null and booleans are not ordered


def _json_with_json(op: str, left: Json, right: Json) -> Cond:
    if op == "=":
        return Cond(f"(COALESCE({left.sql}, {NULL_JSON}) = COALESCE({right.sql}, {NULL_JSON}))")
    left_type, right_type = json_type(left.sql), json_type(right.sql)
    return Cond(
        f"(CASE WHEN {left_type} = 'number' AND {right_type} = 'number'"
        f" THEN {left.sql} {op} {right.sql}"
        f" WHEN {left_type} = 'string' AND {right_type} = 'string'"
        f" THEN {json_string(left.sql)} {op} {json_string(right.sql)}"
        " ELSE FALSE END)"
    )
