"""Configuration problems: every one found is reported, each located in its file."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with the configuration, located as precisely as we can.

    ``path`` is dotted (``state_machines.user.states.3.next``); ``line`` and
    ``column`` are 1-based and ``None`` when the problem has no place in a file
    (a missing file, a missing environment variable).
    """

    file: str
    path: str
    line: int | None
    column: int | None
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.path:
            return f"{where}: {self.path}: {self.message}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """The configuration cannot be used; ``problems`` lists everything wrong with it."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))
