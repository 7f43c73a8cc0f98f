"""Checks of spawn states and ``outcome:`` (SPEC G3) that the schema cannot make.

Pure: given the document's pieces, the problems as (path, message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routemaster.config.formats import split_path
from routemaster.config.source import ConfigPath

CHILDREN_COUNTS = ("total", "succeeded", "failed", "running")
"""What a spawn state's ``next`` may read below ``children``."""

Problems = list[tuple[ConfigPath, str]]


def spawn_problems(path: ConfigPath, state: Mapping[str, Any], machines: set[str]) -> Problems:
    """An unknown child machine, a ``for_each`` that is not a path in the metadata."""
    problems: Problems = []
    machine = state.get("machine")
    if isinstance(machine, str) and machine and machine not in machines:
        known = ", ".join(sorted(machines)) or "none"
        problems.append(
            ((*path, "machine"), f"no state machine called {machine!r} (machines: {known})")
        )
    for_each = state.get("for_each")
    if isinstance(for_each, str):
        parts = split_path(for_each)
        if parts is None or parts[0] != "metadata" or len(parts) < 2:
            problems.append(
                (
                    (*path, "for_each"),
                    f"expected a path in the metadata such as metadata.items, got {for_each!r}",
                )
            )
    return problems


def outcome_problems(
    path: ConfigPath, states: list[Any], names: list[str], edges: Mapping[str, set[str]]
) -> Problems:
    """An ``outcome`` on a state no move leads into: a label only starts there (the first
    state with no way back in), so it would never finish by entering it."""
    entered = {target for targets in edges.values() for target in targets}
    problems: Problems = []
    for index, state in enumerate(states):
        if not isinstance(state, dict) or "outcome" not in state:
            continue
        name = state.get("gate", state.get("action", state.get("spawn")))
        if isinstance(name, str) and name in names and name not in entered:
            problems.append(
                (
                    (*path, "states", index, "outcome"),
                    f"state {name!r} has an outcome but no state leads into it: a child"
                    " created there would never finish by entering it",
                )
            )
    return problems
