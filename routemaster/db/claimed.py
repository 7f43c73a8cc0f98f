"""What a claim of labels hands out: one leased piece of work, in one shape from the claim to
its outcome.

A leaf of the store, apart from the claims themselves (:mod:`routemaster.db.label_claims`):
the writers of a claim's outcome (:mod:`routemaster.db.transitions`) take a :class:`Claim`, and
the claims depend, through the pull tasks' rows (:mod:`routemaster.db.tasks`), on those
writers; the shape living with the claims would make an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from routemaster.db.labels import LabelKey


@dataclass(frozen=True)
class Claim:
    """One leased piece of work, in one shape from the claim to its outcome."""

    state_machine: str
    name: str
    state: str
    metadata: dict[str, Any]
    entry_id: int
    attempts: int  # including this one
    version: int | None = None  # the label's own (routemaster.machine.definitions)

    @property
    def key(self) -> LabelKey:
        return (self.state_machine, self.name)

    @property
    def entry(self) -> tuple[str, str, int]:
        return (self.state_machine, self.name, self.entry_id)
