"""Compile errors that point at the offending span of the source."""

from __future__ import annotations


class ConditionSyntaxError(ValueError):
    """An exit condition that does not compile.

    ``line`` and ``column`` are 1-based; ``length`` is the width of the marked
    span. ``str()`` is the full report (message, source line, ``~~`` marker) so
    that it can be shown to a person as is.
    """

    def __init__(self, message: str, source: str, start: int, end: int) -> None:
        self.message = message
        self.source = source
        start = max(0, min(start, len(source)))
        line_start = source.rfind("\n", 0, start) + 1
        line_end = source.find("\n", start)
        if line_end == -1:
            line_end = len(source)
        self.line = source.count("\n", 0, start) + 1
        self.column = start - line_start + 1
        self.length = max(1, min(end, line_end) - start)
        self._line_text = source[line_start:line_end].rstrip("\r")
        super().__init__(self._render())

    def _render(self) -> str:
        # Keep tabs in the padding so the marker lines up however tabs render.
        padding = "".join(
            "\t" if char == "\t" else " " for char in self._line_text[: self.column - 1]
        )
        return (
            f"Error on line {self.line}: {self.message}\n"
            f"{self._line_text}\n"
            f"{padding}{'~' * self.length}"
        )
