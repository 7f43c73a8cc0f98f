"""The compiled program: an immutable tree of small nodes.

Each node evaluates itself against a :class:`Context`, explains itself
clause by clause, and prints itself back as fully parenthesised source.
Nodes remember their span in the source so explanations quote it exactly.
"""

from __future__ import annotations

import datetime
import decimal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from routemaster.exit_conditions.context import Context, FeedUnavailable
from routemaster.exit_conditions.explain import Clause
from routemaster.exit_conditions.values import (
    compare,
    contains,
    format_duration,
    has_passed,
    truthy,
)


class Explainer:
    """Per-explanation state: the source to quote and the first feed failure."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.error: str | None = None

    def text(self, node: Node) -> str:
        return self.source[node.start : node.end]

    def skipped(self, node: Node) -> Clause:
        return Clause(self.text(node), node.kind, None)


@dataclass(frozen=True)
class Node(ABC):
    """A span of source (``start``/``end`` offsets) compiled to something evaluable."""

    start: int
    end: int
    kind: ClassVar[str]

    @abstractmethod
    def evaluate(self, context: Context) -> Any:
        """The node's value: a boolean for conditions, anything for values."""

    @abstractmethod
    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        """The value (as :meth:`evaluate`) and the clause describing how it came about."""

    @abstractmethod
    def canonical(self) -> str:
        """Fully parenthesised source that compiles to an equivalent node."""


@dataclass(frozen=True)
class Literal(Node):
    value: Any
    kind: ClassVar[str] = "literal"

    def evaluate(self, context: Context) -> Any:
        return self.value

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        return self.value, Clause(explainer.text(self), self.kind, truthy(self.value))

    def canonical(self) -> str:
        value = self.value
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            # Plain decimal digits: the language has no exponent notation.
            text = format(decimal.Decimal(repr(value)), "f")
            return text if "." in text else f"{text}.0"
        if isinstance(value, datetime.timedelta):
            return format_duration(value)
        if isinstance(value, datetime.time):
            return value.strftime("%H:%M:%S" if value.second else "%H:%M")
        return _quote(str(value))


@dataclass(frozen=True)
class Lookup(Node):
    path: tuple[str, ...]
    kind: ClassVar[str] = "lookup"

    def evaluate(self, context: Context) -> Any:
        return context.lookup(self.path)

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        text = explainer.text(self)
        try:
            value = context.lookup(self.path)
        except FeedUnavailable as error:
            explainer.error = explainer.error or str(error)
            return None, Clause(text, self.kind, False, ((text, None),), error=str(error))
        return value, Clause(text, self.kind, truthy(value), ((text, value),))

    def canonical(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class Comparison(Node):
    operator: str
    left: Node
    right: Node
    kind: ClassVar[str] = "comparison"

    def evaluate(self, context: Context) -> bool:
        return compare(self.operator, self.left.evaluate(context), self.right.evaluate(context))

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        (left, right), values, children = _explain_operands(
            context, explainer, self.left, self.right
        )
        held = compare(self.operator, left, right)
        return held, Clause(explainer.text(self), self.kind, held, values, children)

    def canonical(self) -> str:
        return f"({self.left.canonical()} {self.operator} {self.right.canonical()})"


@dataclass(frozen=True)
class IsDefined(Node):
    operand: Node
    negated: bool
    kind: ClassVar[str] = "is defined"

    def evaluate(self, context: Context) -> bool:
        return (self.operand.evaluate(context) is None) is self.negated

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        (value,), values, children = _explain_operands(context, explainer, self.operand)
        held = (value is None) is self.negated
        return held, Clause(explainer.text(self), self.kind, held, values, children)

    def canonical(self) -> str:
        return f"({self.operand.canonical()} is {'not ' if self.negated else ''}defined)"


@dataclass(frozen=True)
class IsIn(Node):
    item: Node
    container: Node
    negated: bool
    kind: ClassVar[str] = "is in"

    def evaluate(self, context: Context) -> bool:
        found = contains(self.container.evaluate(context), self.item.evaluate(context))
        return found is not self.negated

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        (item, container), values, children = _explain_operands(
            context, explainer, self.item, self.container
        )
        held = contains(container, item) is not self.negated
        return held, Clause(explainer.text(self), self.kind, held, values, children)

    def canonical(self) -> str:
        negation = "not " if self.negated else ""
        return f"({self.item.canonical()} is {negation}in {self.container.canonical()})"


@dataclass(frozen=True)
class HasPassed(Node):
    duration: datetime.timedelta
    since: Node
    negated: bool
    kind: ClassVar[str] = "has passed"

    def evaluate(self, context: Context) -> bool:
        passed = has_passed(self.duration, self.since.evaluate(context), context.now)
        return passed is not self.negated

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        (since,), values, children = _explain_operands(context, explainer, self.since)
        held = has_passed(self.duration, since, context.now) is not self.negated
        values += (("now", context.now),)
        return held, Clause(explainer.text(self), self.kind, held, values, children)

    def canonical(self) -> str:
        negation = "not " if self.negated else ""
        duration = format_duration(self.duration)
        return f"({duration} has {negation}passed since {self.since.canonical()})"


@dataclass(frozen=True)
class Not(Node):
    operand: Node
    kind: ClassVar[str] = "not"

    def evaluate(self, context: Context) -> bool:
        return not truthy(self.operand.evaluate(context))

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        value, clause = self.operand.explain(context, explainer)
        held = not truthy(value)
        return held, Clause(explainer.text(self), self.kind, held, children=(clause,))

    def canonical(self) -> str:
        return f"(not {self.operand.canonical()})"


@dataclass(frozen=True)
class Junction(Node):
    """``and`` / ``or`` over two or more operands, short-circuiting."""

    operands: tuple[Node, ...]
    stop_on: ClassVar[bool]

    def evaluate(self, context: Context) -> bool:
        for operand in self.operands:
            if truthy(operand.evaluate(context)) is self.stop_on:
                return self.stop_on
        return not self.stop_on

    def explain(self, context: Context, explainer: Explainer) -> tuple[Any, Clause]:
        held = not self.stop_on
        children = []
        for operand in self.operands:
            if held is self.stop_on:
                children.append(explainer.skipped(operand))
                continue
            value, clause = operand.explain(context, explainer)
            children.append(clause)
            if truthy(value) is self.stop_on:
                held = self.stop_on
        return held, Clause(explainer.text(self), self.kind, held, children=tuple(children))

    def canonical(self) -> str:
        joiner = f" {self.kind} "
        return f"({joiner.join(operand.canonical() for operand in self.operands)})"


@dataclass(frozen=True)
class And(Junction):
    kind: ClassVar[str] = "and"
    stop_on: ClassVar[bool] = False


@dataclass(frozen=True)
class Or(Junction):
    kind: ClassVar[str] = "or"
    stop_on: ClassVar[bool] = True


def _explain_operands(
    context: Context, explainer: Explainer, *operands: Node
) -> tuple[list[Any], tuple[tuple[str, Any], ...], tuple[Clause, ...]]:
    """Evaluate operands, noting the values of all but literals.

    Lookups contribute their value (and their clause as a child when a feed
    failed); compound operands (a parenthesised condition) contribute their
    value and their own clause as a child.
    """
    results = []
    values: list[tuple[str, Any]] = []
    children = []
    for operand in operands:
        value, clause = operand.explain(context, explainer)
        results.append(value)
        if isinstance(operand, Lookup):
            values.extend(clause.values)
            if clause.error is not None:
                children.append(clause)
        elif not isinstance(operand, Literal):
            values.append((clause.text, value))
            children.append(clause)
    return results, tuple(values), tuple(children)


def _quote(text: str) -> str:
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'
