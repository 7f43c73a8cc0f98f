"""Explanations: a condition evaluated clause by clause, for people.

This answers "why is this label not moving": each clause carries its source
text, the values it saw and whether it held. Clauses skipped by
short-circuiting are kept, marked as not evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from routemaster.exit_conditions.values import to_json


@dataclass(frozen=True)
class Clause:
    """One node of the condition: ``held`` is None when it was not evaluated."""

    text: str
    kind: str
    held: bool | None
    values: tuple[tuple[str, Any], ...] = ()
    children: tuple[Clause, ...] = ()
    error: str | None = None

    @property
    def evaluated(self) -> bool:
        return self.held is not None

    def walk(self) -> Iterator[Clause]:
        """This clause and every clause below it, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "text": self.text,
            "kind": self.kind,
            "evaluated": self.evaluated,
            "held": self.held,
            "values": [{"text": text, "value": to_json(value)} for text, value in self.values],
            "children": [child.to_json() for child in self.children],
        }
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass(frozen=True)
class Explanation:
    """The whole condition explained.

    ``result`` is None when the evaluation could not decide because a feed
    was unavailable; ``error`` then says which and why.
    """

    source: str
    result: bool | None
    clause: Clause
    warnings: tuple[str, ...] = ()
    error: str | None = None

    def clauses(self) -> Iterator[Clause]:
        return self.clause.walk()

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "result": self.result,
            "error": self.error,
            "warnings": list(self.warnings),
            "clause": self.clause.to_json(),
        }
