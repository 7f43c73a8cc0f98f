"""Exit-condition source to a SQL condition over the ``labels`` table.

``compile_search(source, now)`` parses with the gate language's own parser
(so a mistake gets the same caret message), then turns the tree into one
boolean SQL expression with bound parameters (``%(w0)s``, ...; run by
:mod:`routemaster.db.search`) that selects exactly the labels
for which the gate evaluator would say true at ``now``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from routemaster.exit_conditions import compile_condition
from routemaster.exit_conditions.nodes import (
    And,
    Comparison,
    HasPassed,
    IsDefined,
    IsIn,
    Junction,
    Literal,
    Lookup,
    Node,
    Not,
    Or,
)
from routemaster.search import rules
from routemaster.search.operands import Const, Json, Moment, Operand, Params, truth

MAX_SOURCE_LENGTH = 4096
"""The longest expression a search takes (the parser bounds nesting; this bounds breadth)."""

_COLUMNS: Mapping[tuple[str, ...], Operand] = {
    ("history", "entered_state"): Moment("state_entered_at"),
    ("system", "entered_state"): Moment("state_entered_at"),
    ("history", "previous_state"): Json("to_jsonb(previous_state)"),
    ("history", "current_state"): Json("to_jsonb(state)"),
    ("system", "label"): Json("to_jsonb(name)"),
}


@dataclass(frozen=True)
class SearchFilter:
    """A compiled search: ``sql`` is a condition on a ``labels`` row, ``params`` its values."""

    source: str
    sql: str
    params: Mapping[str, Any]


def compile_search(source: str, now: datetime.datetime) -> SearchFilter:
    """Compile ``source`` (raises ``ConditionSyntaxError``, whose text has the caret)."""
    params = Params(source)
    if len(source) > MAX_SOURCE_LENGTH:
        raise params.refuse(
            f"A search expression is limited to {MAX_SOURCE_LENGTH} characters",
            Literal(MAX_SOURCE_LENGTH, len(source), None),
        )
    program = compile_condition(source)
    if program.warnings:
        _refuse_mixed(program.root, params)
    condition = truth(_Compiler(params, now).value(program.root))
    return SearchFilter(source, condition.sql, dict(params.values))


@dataclass(frozen=True)
class _Compiler:
    params: Params
    now: datetime.datetime

    def value(self, node: Node) -> Operand:
        if isinstance(node, Literal):
            return Const(node.value)
        if isinstance(node, Lookup):
            return self.lookup(node)
        if isinstance(node, Comparison):
            left, right = self.value(node.left), self.value(node.right)
            return rules.compare(node.operator, left, right, self.params, node)
        if isinstance(node, IsDefined):
            found = rules.defined(self.value(node.operand))
            return rules.negate(found) if node.negated else found
        if isinstance(node, IsIn):
            item, container = self.value(node.item), self.value(node.container)
            found = rules.contains(container, item, self.params, node)
            return rules.negate(found) if node.negated else found
        if isinstance(node, HasPassed):
            since = self.value(node.since)
            found = rules.has_passed(node.duration, since, self.now, self.params, node)
            return rules.negate(found) if node.negated else found
        if isinstance(node, Not):
            return rules.negate(truth(self.value(node.operand)))
        if isinstance(node, Junction):
            word = "AND" if isinstance(node, And) else "OR"
            return rules.junction(word, [truth(self.value(each)) for each in node.operands])
        raise self.params.refuse("A search cannot use this clause", node)

    def lookup(self, node: Lookup) -> Operand:
        path = node.path
        if path[0] == "metadata":
            return Json(self.params.path(path[1:])) if len(path) > 1 else Json("metadata")
        if path[0] == "feeds":
            raise self.params.refuse(
                "A search cannot read feeds: they are fetched over HTTP when a gate is "
                "evaluated, not stored with the label",
                node,
            )
        if path == ("system", "now"):
            return Const(self.now)
        if path == ("system", "time"):
            return Const(self.now.timetz())
        return _COLUMNS[path]


def _refuse_mixed(root: Node, params: Params) -> None:
    """A search mixing ``and`` and ``or`` without parentheses is refused (SPEC D5).

    In this language ``or`` binds tighter than ``and``; a gate's ``validate``
    warns about it, a search has no such step, so it asks for parentheses.
    """
    for node in _walk(root):
        if not isinstance(node, And):
            continue
        for operand in node.operands:
            if isinstance(operand, Or) and operand.start == operand.operands[0].start:
                raise params.refuse(
                    "'and' and 'or' mixed without parentheses: 'or' binds tighter than "
                    f"'and' in this language, so this means {node.canonical()}; "
                    "add parentheses to say which you mean",
                    node,
                )


def _walk(node: Node) -> Iterator[Node]:
    yield node
    for field in dataclasses.fields(node):
        child = getattr(node, field.name)
        if isinstance(child, Node):
            yield from _walk(child)
        elif isinstance(child, tuple):
            for each in child:
                if isinstance(each, Node):
                    yield from _walk(each)
