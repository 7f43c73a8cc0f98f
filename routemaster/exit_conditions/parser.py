"""The grammar: tokens to a tree of nodes, by recursive descent.

    condition  := conjunction END
    conjunction:= disjunction ("and" disjunction)*
    disjunction:= negation ("or" negation)*
    negation   := "not" negation | predicate
    predicate  := value [ OPERATOR value
                        | "is" ["not"] "defined"
                        | "is" ["not"] "in" value
                        | DURATION "has" ["not"] "passed" "since" value ]
    value      := LITERAL | "true" | "false" | "null" | PATH | "(" conjunction ")"

``or`` binds tighter than ``and``, as in routemaster 1.x: ``a and b or c``
means ``a and (b or c)``. Mixing the two without parentheses compiles but
leaves a warning, because most readers expect the opposite.
"""

from __future__ import annotations

import dataclasses
import datetime

from routemaster.exit_conditions.compile_errors import ConditionSyntaxError
from routemaster.exit_conditions.nodes import (
    And,
    Comparison,
    HasPassed,
    IsDefined,
    IsIn,
    Literal,
    Lookup,
    Node,
    Not,
    Or,
)
from routemaster.exit_conditions.program import Program
from routemaster.exit_conditions.tokenizer import KEYWORDS, Kind, Token, tokenize

ROOTS = ("metadata", "feeds", "history", "system")
FIELDS = {
    "history": ("entered_state", "previous_state", "current_state"),
    "system": ("now", "time", "entered_state", "label"),
}
_CONSTANTS = {"true": True, "false": False, "null": None}
MAX_DEPTH = 50
"""Deepest nesting of parentheses and ``not``: keeps recursion far from Python's limit."""


def compile_condition(source: str) -> Program:
    """Compile exit-condition source, raising :class:`ConditionSyntaxError`."""
    parser = _Parser(source, tokenize(source))
    root = parser.parse()
    paths = frozenset(parser.paths)
    return Program(
        source=source,
        root=root,
        paths=paths,
        feeds=frozenset(path[1] for path in paths if path[0] == "feeds"),
        warnings=tuple(parser.warnings),
    )


class _Parser:
    def __init__(self, source: str, tokens: list[Token]) -> None:
        self.source = source
        self.tokens = tokens
        self.index = 0
        self.depth = 0
        self.paths: list[tuple[str, ...]] = []
        self.warnings: list[str] = []

    def parse(self) -> Node:
        if self._peek().kind is Kind.END:
            raise self._error("Expected a condition, found nothing", self._peek())
        node = self._conjunction()
        token = self._peek()
        if token.kind is Kind.RPAREN:
            raise self._error("Unmatched ')'", token)
        if token.kind is not Kind.END:
            raise self._error(
                f"Unexpected {_describe(token)} (expected and, or, or the end of the condition)",
                token,
            )
        return node

    def _conjunction(self) -> Node:
        first, mixed = self._disjunction()
        operands = [first]
        while self._accept_keyword("and"):
            operand, bare_or = self._disjunction()
            operands.append(operand)
            mixed = mixed or bare_or
        if len(operands) == 1:
            return first
        node = And(first.start, operands[-1].end, tuple(operands))
        if mixed:
            line = self.source.count("\n", 0, node.start) + 1
            self.warnings.append(
                f"line {line}: 'and' and 'or' mixed without parentheses; 'or' binds "
                f"tighter than 'and' (as in routemaster 1.x), so this means "
                f"{node.canonical()}"
            )
        return node

    def _disjunction(self) -> tuple[Node, bool]:
        """The disjunction, and whether it has a bare (unparenthesised) ``or``."""
        first = self._negation()
        operands = [first]
        while self._accept_keyword("or"):
            operands.append(self._negation())
        if len(operands) == 1:
            return first, False
        return Or(first.start, operands[-1].end, tuple(operands)), True

    def _negation(self) -> Node:
        token = self._peek()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self._error(f"Nested too deeply (more than {MAX_DEPTH} levels)", token)
        try:
            if self._accept_keyword("not"):
                operand = self._negation()
                return Not(token.start, operand.end, operand)
            return self._predicate()
        finally:
            self.depth -= 1

    def _predicate(self) -> Node:
        left = self._value()
        token = self._peek()
        if token.kind is Kind.OPERATOR:
            self.index += 1
            right = self._value()
            return Comparison(left.start, right.end, token.text, left, right)
        if self._accept_keyword("is"):
            negated = self._accept_keyword("not")
            if self._accept_keyword("defined"):
                return IsDefined(left.start, self._previous().end, left, negated)
            if self._accept_keyword("in"):
                container = self._value()
                return IsIn(left.start, container.end, left, container, negated)
            raise self._error(
                f"Expected 'defined' or 'in' after '{self._previous().text}', "
                f"found {_describe(self._peek())}",
                self._peek(),
            )
        if token.kind is Kind.KEYWORD and token.text == "has":
            if not (isinstance(left, Literal) and isinstance(left.value, datetime.timedelta)):
                raise self._error(
                    "'has passed since' needs a duration before it, e.g. 1d12h",
                    self.tokens[self.index - 1],
                    start=left.start,
                )
            self.index += 1
            negated = self._accept_keyword("not")
            for word in ("passed", "since"):
                if not self._accept_keyword(word):
                    raise self._error(
                        f"Expected '{word}' after '{self._previous().text}', "
                        f"found {_describe(self._peek())}",
                        self._peek(),
                    )
            since = self._value()
            return HasPassed(left.start, since.end, left.value, since, negated)
        return left

    def _value(self) -> Node:
        token = self._peek()
        if token.kind is Kind.LITERAL:
            self.index += 1
            return Literal(token.start, token.end, token.value)
        if token.kind is Kind.KEYWORD and token.text in _CONSTANTS:
            self.index += 1
            return Literal(token.start, token.end, _CONSTANTS[token.text])
        if token.kind is Kind.PATH:
            self.index += 1
            self._check_path(token)
            self.paths.append(token.value)
            return Lookup(token.start, token.end, token.value)
        if token.kind is Kind.LPAREN:
            self.index += 1
            inner = self._conjunction()
            closing = self._peek()
            if closing.kind is not Kind.RPAREN:
                line = self.source.count("\n", 0, token.start) + 1
                column = token.start - self.source.rfind("\n", 0, token.start)
                raise self._error(
                    f"Missing ')' to close the '(' at line {line}, column {column}; "
                    f"found {_describe(closing)}",
                    closing,
                )
            self.index += 1
            # The span takes in the parentheses so explanations quote them.
            return dataclasses.replace(inner, start=token.start, end=closing.end)
        after = f" after '{self._previous().text}'" if self.index else ""
        raise self._error(f"Expected a value{after}, found {_describe(token)}", token)

    def _check_path(self, token: Token) -> None:
        path: tuple[str, ...] = token.value
        root = path[0]
        if len(path) == 1 and root.lower() in KEYWORDS:
            raise self._error(f"Unknown name {root} (did you mean {root.lower()}?)", token)
        if root not in ROOTS:
            raise self._error(
                f"Unknown path {token.text}: a lookup starts with metadata, feeds, "
                "history or system",
                token,
            )
        if any(segment.isdigit() and len(segment) > 9 for segment in path):
            raise self._error(f"List index too large in {token.text}", token)
        if root == "feeds" and len(path) < 2:
            raise self._error("Expected a feed name: feeds.NAME or feeds.NAME.field", token)
        if root in FIELDS and (len(path) != 2 or path[1] not in FIELDS[root]):
            raise self._error(
                f"Unknown path {token.text}: {root} has {', '.join(FIELDS[root])}", token
            )

    def _peek(self) -> Token:
        return self.tokens[self.index]

    def _previous(self) -> Token:
        return self.tokens[self.index - 1]

    def _accept_keyword(self, word: str) -> bool:
        token = self.tokens[self.index]
        if token.kind is Kind.KEYWORD and token.text == word:
            self.index += 1
            return True
        return False

    def _error(self, message: str, token: Token, start: int | None = None) -> ConditionSyntaxError:
        begin = token.start if start is None else start
        end = max(token.end, begin + 1)
        return ConditionSyntaxError(message, self.source, begin, end)


def _describe(token: Token) -> str:
    if token.kind is Kind.END:
        return "the end of the condition"
    return f"'{token.text}'"
