"""The exit-condition language: compile once, evaluate against a context.

Layers, each importing only the ones before it: ``tokens`` (lexing, with
positions) → ``parser`` (grammar to nodes) → ``nodes``/``program``
(evaluation, explanation, canonical printing), with ``errors`` for compile
errors that point at the source; ``next_check`` solves a program's time
clauses for the earliest moment it could hold. Everything here is pure:
feeds and the clock come in through the :class:`Context`.
"""

from routemaster.exit_conditions.compile_errors import ConditionSyntaxError
from routemaster.exit_conditions.context import Context, FeedUnavailable
from routemaster.exit_conditions.explain import Clause, Explanation
from routemaster.exit_conditions.next_check import NextCheck, Timing, compile_timing
from routemaster.exit_conditions.parser import compile_condition
from routemaster.exit_conditions.program import Program

__all__ = [
    "Clause",
    "ConditionSyntaxError",
    "Context",
    "Explanation",
    "FeedUnavailable",
    "NextCheck",
    "Program",
    "Timing",
    "compile_condition",
    "compile_timing",
]
