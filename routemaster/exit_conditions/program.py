"""A compiled exit condition: evaluated many times, never re-parsed."""

from __future__ import annotations

from dataclasses import dataclass, field

from routemaster.exit_conditions.context import Context
from routemaster.exit_conditions.explain import Explanation
from routemaster.exit_conditions.nodes import Explainer, Node
from routemaster.exit_conditions.values import truthy


@dataclass(frozen=True)
class Program:
    """An exit condition compiled by :func:`compile_condition`.

    Two programs are equal when their sources are: the configuration that
    holds them compares and hashes by what the user wrote.
    """

    source: str
    root: Node = field(compare=False, repr=False)
    paths: frozenset[tuple[str, ...]] = field(compare=False, repr=False)
    feeds: frozenset[str] = field(compare=False, repr=False)
    warnings: tuple[str, ...] = field(compare=False, repr=False)

    def evaluate(self, context: Context) -> bool:
        """Whether the condition holds; raises only ``FeedUnavailable``."""
        return truthy(self.root.evaluate(context))

    def explain(self, context: Context) -> Explanation:
        """Evaluate clause by clause; a feed failure is reported, not raised."""
        explainer = Explainer(self.source)
        value, clause = self.root.explain(context, explainer)
        result = None if explainer.error is not None else truthy(value)
        return Explanation(self.source, result, clause, self.warnings, explainer.error)

    def canonical(self) -> str:
        """The condition as fully parenthesised source (comments and layout dropped)."""
        return self.root.canonical()
