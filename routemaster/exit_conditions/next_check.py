"""PLACEHOLDER until the next-check branch merges: always "now" (sound, never exact)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from routemaster.exit_conditions.context import Context
from routemaster.exit_conditions.program import Program


@dataclass(frozen=True)
class NextCheck:
    at: datetime.datetime | None
    reason: str


class Timing:
    def __init__(self, program: Program) -> None:
        self.program = program

    def next_check(
        self, context_at: Callable[[datetime.datetime], Context], after: datetime.datetime
    ) -> NextCheck:
        return NextCheck(after, "placeholder")


def compile_timing(program: Program) -> Timing:
    return Timing(program)
