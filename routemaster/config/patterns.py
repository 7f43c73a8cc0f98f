"""The ``webhooks: match`` patterns: checked at load in bounded time, then trusted.

A rule's pattern is searched in the configured URL *template* (before any
label is substituted), so a label name can never choose which headers, and
so which secrets, a request carries. The templates are known when the
configuration loads, so every (pattern, template) pair is tried then, with a
time limit: a pattern that backtracks catastrophically on a configured URL
is a configuration error, and at run time the same searches are fast by
construction.

Patterns use the ``regex`` module (a superset of :mod:`re` with a search
timeout). Before compiling, a pattern's size is bounded: its length, its
parenthesis nesting (deep nesting exhausts the parser's recursion) and the
product of its repeat counts (``regex`` expands ``{n}`` when compiling, so
``((a{1000}){1000}){1000}`` would need gigabytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import regex

MAX_PATTERN_LENGTH = 1000
MAX_NESTING = 50
MAX_REPEAT_PRODUCT = 10_000
SEARCH_SECONDS = 0.1  # per configured URL, at load

_COUNTED_REPEAT = regex.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def pattern_problems(pattern: str, templates: Iterable[str]) -> list[str]:
    """What is wrong with ``pattern``, tried against each configured URL template."""
    size = _size_problem(pattern)
    if size is not None:
        return [f"regular expression {_shown(pattern)} {size}"]
    try:
        compiled = regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError, MemoryError, ValueError) as error:
        return [f"invalid regular expression {_shown(pattern)}: {error}"]
    problems = []
    for template in templates:
        try:
            compiled.search(template, timeout=SEARCH_SECONDS)
        except TimeoutError:
            problems.append(
                f"regular expression {_shown(pattern)} took over {SEARCH_SECONDS:g} s on "
                f"{template!r} (catastrophic backtracking): simplify it"
            )
    return problems


def rule_matches(pattern: str, template: str) -> bool:
    """Whether a (load-checked) rule applies to a URL template."""
    return regex.search(pattern, template) is not None


def _size_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"is longer than {MAX_PATTERN_LENGTH} characters"
    depth = deepest = 0
    escaped = False
    for character in pattern:
        if escaped:
            escaped = False
        elif character == "\\":
            escaped = True
        elif character == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif character == ")":
            depth = max(0, depth - 1)
    if deepest > MAX_NESTING:
        return f"nests parentheses deeper than {MAX_NESTING} levels"
    counts = [
        max(int(low), int(high) if high else 0) for low, high in _COUNTED_REPEAT.findall(pattern)
    ]
    if counts and math.prod(max(count, 1) for count in counts) > MAX_REPEAT_PRODUCT:
        return f"repeats too much: its repeat counts multiply to more than {MAX_REPEAT_PRODUCT}"
    return None


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 80 else pattern[:77] + "...")
