"""Checking a machine's ``migrations:``: each ``from`` is a state it no longer has, each ``to`` one
it has, and no state is migrated twice; and its ``upgrade_strategy`` with ``abort_to``.

Pure, like the rest of validation: the caller reports each problem against its path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from routemaster.config.source import ConfigPath

_STATE_NAME = re.compile(r"[A-Za-z0-9_]+")
KINDS = ("rename", "move")


def migration_problems(
    path: ConfigPath, migrations: Any, states: Sequence[str]
) -> list[tuple[ConfigPath, str]]:
    """Every problem of the ``migrations`` list at ``path``, located at its key."""
    if not isinstance(migrations, list):
        return []
    problems: list[tuple[ConfigPath, str]] = []
    known = ", ".join(states) or "none"
    first: dict[str, int] = {}
    for index, entry in enumerate(migrations):
        kind = next((kind for kind in KINDS if isinstance(entry, dict) and kind in entry), None)
        body = entry.get(kind) if kind is not None else None
        if kind is None or not isinstance(body, dict):
            continue  # the schema reports the shape
        where = (*path, index, kind)
        source, target = body.get("from"), body.get("to")
        if isinstance(source, str):
            if not _STATE_NAME.fullmatch(source):
                problems.append(
                    (
                        (*where, "from"),
                        f"invalid state name {source!r}: use letters, digits and underscores only",
                    )
                )
            elif source in states:
                problems.append(
                    (
                        (*where, "from"),
                        f"{kind} from {source!r}: the state machine still has a state called"
                        f" {source!r} (a migration's from is a state the configuration no"
                        " longer has)",
                    )
                )
            if source in first:
                problems.append(
                    (
                        (*where, "from"),
                        f"state {source!r} is already migrated by migrations.{first[source]}",
                    )
                )
            else:
                first[source] = index
        if isinstance(target, str) and target not in states:
            problems.append(
                (
                    (*where, "to"),
                    f"{kind} to {target!r}: no state called {target!r} (states: {known})",
                )
            )
    return problems


def strategy_problems(
    path: ConfigPath, machine: dict[str, Any], states: Sequence[str]
) -> list[tuple[ConfigPath, str]]:
    """``upgrade_strategy: abort`` needs ``abort_to``, a state of the machine; nothing else may."""
    strategy = machine.get("upgrade_strategy", "upgrade")
    target = machine.get("abort_to")
    if strategy == "abort" and target is None:
        return [
            (
                (*path, "upgrade_strategy"),
                "upgrade_strategy abort needs abort_to: the state older versions' labels go to",
            )
        ]
    if target is not None and strategy != "abort":
        return [((*path, "abort_to"), "abort_to is only for upgrade_strategy: abort")]
    if isinstance(target, str) and target not in states:
        known = ", ".join(states) or "none"
        return [((*path, "abort_to"), f"no state called {target!r} (states: {known})")]
    return []
