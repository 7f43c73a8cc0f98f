"""Where each part of the (layered) configuration came from.

Validation works on the merged document, but a problem is only useful when it
names the file and line the offending value was written on; the
:class:`SourceMap` keeps that side table through layering.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from routemaster.config.problems import ConfigProblem

ConfigPath = tuple[str | int, ...]
"""A path into the document: mapping keys and sequence indices."""


@dataclass(frozen=True)
class Mark:
    """A place in a file, 1-based."""

    file: str
    line: int
    column: int


@dataclass(frozen=True)
class ScalarMark:
    """Where a scalar value starts and ends, and its YAML style (``|``, ``>``, quotes, plain)."""

    file: str
    line: int
    column: int
    style: str | None
    end_line: int
    end_column: int  # just after the value


@dataclass
class SourceMap:
    """Positions of mapping keys and sequence items (``keys``) and of scalar values."""

    default_file: str
    keys: dict[ConfigPath, Mark] = field(default_factory=dict)
    scalars: dict[ConfigPath, ScalarMark] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)  # file -> its lines

    def locate(self, path: ConfigPath) -> Mark | None:
        """The mark of ``path``, or of its nearest ancestor that has one."""
        for end in range(len(path), 0, -1):
            mark = self.keys.get(path[:end])
            if mark is not None:
                return mark
        return None

    def problem(
        self,
        path: ConfigPath,
        message: str,
        *,
        line: int | None = None,
        column: int | None = None,
    ) -> ConfigProblem:
        """A problem at ``path``; ``line``/``column`` override the key's own position."""
        mark = self.locate(path)
        file = mark.file if mark else self.default_file
        if line is None and mark is not None:
            line, column = mark.line, mark.column
        return ConfigProblem(file, dotted(path), line, column, message)

    def source_line(self, file: str, line: int) -> str | None:
        lines = self.texts.get(file, [])
        return lines[line - 1] if 0 < line <= len(lines) else None

    def _adopt(self, other: SourceMap, prefix: ConfigPath) -> None:
        """Take ``other``'s positions for ``prefix`` and everything below it."""
        depth = len(prefix)
        for path, mark in other.keys.items():
            if path[:depth] == prefix:
                self.keys[path] = mark
        for path, scalar in other.scalars.items():
            if path[:depth] == prefix:
                self.scalars[path] = scalar

    def _forget(self, prefix: ConfigPath) -> None:
        """Drop the positions below ``prefix`` (its own key position stays)."""
        depth = len(prefix)
        for table in (self.keys, self.scalars):
            for path in [p for p in table if len(p) > depth and p[:depth] == prefix]:
                del table[path]
        self.scalars.pop(prefix, None)


def dotted(path: ConfigPath) -> str:
    return ".".join(str(part) for part in path)


def merge_layers(layers: list[tuple[Any, SourceMap]]) -> tuple[Any, SourceMap]:
    """Deep-merge documents, later over earlier: maps merge, anything else is replaced.

    The layers are not modified; the result's source map says, for each path,
    which layer its value came from.
    """
    merged = SourceMap(default_file=layers[0][1].default_file if layers else "<none>")
    document: Any = None
    for index, (data, source) in enumerate(layers):
        merged.texts.update(source.texts)
        if index == 0:
            merged._adopt(source, ())
            document = copy.deepcopy(data)
        else:
            document = _merge(document, copy.deepcopy(data), (), source, merged)
    return document, merged


def _merge(base: Any, over: Any, path: ConfigPath, source: SourceMap, merged: SourceMap) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        for key, value in over.items():
            child = (*path, key)
            if key in base:
                base[key] = _merge(base[key], value, child, source, merged)
            else:
                merged._adopt(source, child)
                base[key] = value
        return base
    merged._forget(path)
    merged._adopt(source, path)
    return over
