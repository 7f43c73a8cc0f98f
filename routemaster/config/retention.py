"""``retention:``, top level and per machine: how long history, deleted and finished labels stay.

Pure: the schema fragment, the checks (each value a duration longer than
zero, located by path) and the compiled :class:`~routemaster.config.model.Retention`,
a machine's keys overriding the top level's one by one. No ``retention``
anywhere keeps everything, as 1.x did.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from routemaster.config.formats import parse_duration
from routemaster.config.model import Retention
from routemaster.config.source import ConfigPath

KEYS = ("history", "deleted", "finished")

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        key: {
            "type": "string",
            "x-messages": {"type": "expected a duration such as 180d, 36h or 30m (as text)"},
        }
        for key in KEYS
    },
}


def retention_problems(document: Any) -> Iterator[tuple[ConfigPath, str]]:
    """Each ``retention`` value that is not a duration longer than zero, with its path."""
    if not isinstance(document, dict):
        return
    yield from _section(("retention",), document.get("retention"))
    machines = document.get("state_machines")
    if isinstance(machines, dict):
        for name, machine in machines.items():
            if isinstance(machine, dict):
                yield from _section(("state_machines", name, "retention"), machine.get("retention"))


def _section(path: ConfigPath, section: Any) -> Iterator[tuple[ConfigPath, str]]:
    if not isinstance(section, dict):
        return
    for key in KEYS:
        text = section.get(key)
        if not isinstance(text, str):
            continue  # absent, or a type error the schema reports
        duration = parse_duration(text)
        if duration is None:
            yield (*path, key), f"expected a duration such as 180d, 36h or 30m, got {text!r}"
        elif duration <= datetime.timedelta(0):
            yield (*path, key), f"must be longer than zero, got {text!r}"


def compile_retention(section: dict[str, Any] | None, base: Retention | None = None) -> Retention:
    """``section``'s keys over ``base`` (checked already: every value parses)."""
    base = Retention() if base is None else base
    if not section:
        return base
    values = {key: parse_duration(section[key]) for key in KEYS if key in section}
    return Retention(**{key: values.get(key, getattr(base, key)) for key in KEYS})
