"""Bounds on reading a configuration file: size, text, nesting, alias expansion.

Configuration is operator input, but a mistaken or hostile file must still
end in a clear problem in bounded time and memory, never a traceback or a
hang: files over :data:`MAX_FILE_BYTES`, bytes that are not UTF-8,
characters YAML forbids (NUL, most control characters), nesting deeper than
:data:`MAX_DEPTH` and alias graphs that expand to more than
:data:`MAX_EXPANDED_VALUES` values ("billion laughs": a few lines of
anchors that stand for billions of values once every alias is followed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from routemaster.config.problems import ConfigProblem

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_EXPANDED_VALUES = 100_000


class DepthLimitedComposer(yaml.composer.Composer):
    """PyYAML's composer (recursive) stopped at :data:`MAX_DEPTH` levels with a marked error."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()  # type: ignore[attr-defined]  # from the Parser
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"the document nests deeper than {MAX_DEPTH} levels",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_text(path: str | Path) -> tuple[str | None, ConfigProblem | None]:
    """The file's text, or the problem that stops it being read (size, encoding, I/O)."""
    file = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        return None, ConfigProblem(file, "", None, None, f"cannot read file: {error}")
    if len(data) > MAX_FILE_BYTES:
        return None, ConfigProblem(
            file, "", None, None, f"the file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB"
        )
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as error:
        line, column = _position(data[: error.start])
        return None, ConfigProblem(
            file,
            "",
            line,
            column,
            f"the file is not UTF-8 text: byte 0x{data[error.start]:02x} cannot be decoded",
        )


def reader_problem(file: str, text: str, error: yaml.reader.ReaderError) -> ConfigProblem:
    """A character YAML does not allow, with its line and column."""
    line, column = _position(text[: error.position].encode("utf-8"))
    character = error.character
    code = ord(character) if isinstance(character, str) else int(character)
    return ConfigProblem(
        file,
        "",
        line,
        column,
        f"character U+{code:04X} is not allowed in YAML (NUL and control characters are not)",
    )


def expansion_problem(file: str, root: yaml.Node) -> ConfigProblem | None:
    """A problem if following every alias would give more than the allowed number of values.

    Counted over the node graph with each node's expanded size computed once,
    so the count itself is linear in the file, however much it would expand.
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if not children_done:
            if key in on_path:
                continue  # an alias to its own ancestor: reported when positions are recorded
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        on_path.discard(key)
        sizes[key] = 1 + sum(sizes.get(id(child), 1) for child in children)
        if sizes[key] > MAX_EXPANDED_VALUES:
            mark = node.start_mark
            return ConfigProblem(
                file,
                "",
                mark.line + 1,
                mark.column + 1,
                f"the document expands to more than {MAX_EXPANDED_VALUES} values "
                "through anchors and aliases",
            )
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _position(before: bytes) -> tuple[int, int]:
    """1-based line and column of the byte after ``before``."""
    line = before.count(b"\n") + 1
    column = len(before) - (before.rfind(b"\n") + 1) + 1
    return line, column
