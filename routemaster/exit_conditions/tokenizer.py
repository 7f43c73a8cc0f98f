"""The tokenizer: source text to a list of tokens that remember their span.

Literal values (numbers, durations, times of day, strings) are decoded here so
that the parser only deals with structure, and every lexical mistake is
reported against the exact characters that caused it.
"""

from __future__ import annotations

import datetime
import enum
import re
from dataclasses import dataclass
from typing import Any

from routemaster.exit_conditions.compile_errors import ConditionSyntaxError

KEYWORDS = frozenset(
    {"true", "false", "null", "and", "or", "not", "is", "defined", "in", "has", "passed", "since"}
)


class Kind(enum.Enum):
    KEYWORD = "keyword"
    PATH = "path"
    LITERAL = "literal"
    OPERATOR = "operator"
    LPAREN = "("
    RPAREN = ")"
    END = "end of condition"


@dataclass(frozen=True)
class Token:
    kind: Kind
    text: str
    start: int
    end: int
    value: Any = None  # the decoded literal, or the path as a tuple of segments


OPERATORS = ("<=", ">=", "/=", "=", "<", ">")
_MISTAKES = {
    "==": "=",
    "!=": "/=",
    "<>": "/=",
    "=<": "<=",
    "=>": ">=",
    "&&": "and",
    "||": "or",
}
_WHITESPACE = " \t\r\n"
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_NUMERIC_RUN = re.compile(r"-?[0-9][0-9A-Za-z_.:]*")
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r"}


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens, ending with an END token."""
    tokens: list[Token] = []
    position = 0
    length = len(source)
    while True:
        while position < length:
            if source[position] in _WHITESPACE:
                position += 1
            elif source[position] == "#":
                newline = source.find("\n", position)
                position = length if newline == -1 else newline
            else:
                break
        if position >= length:
            # Errors at the end point just after the last token, not after
            # trailing comments or blank lines.
            end = tokens[-1].end if tokens else 0
            tokens.append(Token(Kind.END, "", end, end))
            return tokens
        token = _next_token(source, position)
        tokens.append(token)
        position = token.end


def _next_token(source: str, position: int) -> Token:
    char = source[position]
    pair = source[position : position + 2]
    if pair in _MISTAKES:
        raise ConditionSyntaxError(
            f"Unknown operator {pair} (did you mean {_MISTAKES[pair]}?)",
            source,
            position,
            position + 2,
        )
    for operator in OPERATORS:
        if source.startswith(operator, position):
            return Token(Kind.OPERATOR, operator, position, position + len(operator))
    if char == "(":
        return Token(Kind.LPAREN, char, position, position + 1)
    if char == ")":
        return Token(Kind.RPAREN, char, position, position + 1)
    if char in "\"'":
        return _string(source, position)
    run = _NUMERIC_RUN.match(source, position)
    if run:
        return _numeric(source, position, run.end())
    word = _WORD.match(source, position)
    if word:
        return _word(source, position, word.end())
    raise ConditionSyntaxError(f"Unexpected character {char!r}", source, position, position + 1)


def _word(source: str, start: int, end: int) -> Token:
    segments = [source[start:end]]
    while source.startswith(".", end):
        segment = _SEGMENT.match(source, end + 1)
        if segment is None:
            raise ConditionSyntaxError("Expected a name after '.'", source, end, end + 1)
        segments.append(segment.group())
        end = segment.end()
    text = source[start:end]
    if len(segments) == 1 and text in KEYWORDS:
        return Token(Kind.KEYWORD, text, start, end)
    return Token(Kind.PATH, text, start, end, tuple(segments))


def _numeric(source: str, start: int, end: int) -> Token:
    text = source[start:end]

    def error(message: str) -> ConditionSyntaxError:
        return ConditionSyntaxError(message, source, start, end)

    shown = text if len(text) <= 30 else f"{text[:27]}..."

    value: Any
    if _INT.fullmatch(text):
        try:
            value = int(text)
        except ValueError:  # more digits than Python will convert
            raise error(f"Number too large: {shown}") from None
    elif _FLOAT.fullmatch(text):
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise error(f"Number too large: {shown}")
    elif text.startswith("-"):
        raise error(f"Invalid number {shown!r} (only numbers can be negative)")
    elif (time := _TIME.fullmatch(text)) is not None:
        hour, minute, second = (int(part or 0) for part in time.groups())
        if hour > 23 or minute > 59 or second > 59:
            raise error(f"Invalid time of day {shown!r}")
        value = datetime.time(hour, minute, second)
    elif (duration := _DURATION.fullmatch(text)) is not None:
        try:
            days, hours, minutes, seconds = (int(part or 0) for part in duration.groups())
            value = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        except (OverflowError, ValueError):  # ValueError: more digits than int() takes
            raise error(f"Duration too large: {shown}") from None
    elif ":" in text:
        raise error(f"Invalid time of day {shown!r} (write e.g. 18:30 or 18:30:15)")
    elif "." in text and any(char.isalpha() for char in text):
        raise error(f"Invalid duration {shown!r} (durations use whole numbers, e.g. 1h30m)")
    elif "." in text:
        raise error(f"Invalid number {shown!r}")
    else:
        raise error(
            f"Invalid duration {shown!r} (write e.g. 1d12h, 30m or 1h30m45s: "
            "units d, h, m, s in that order)"
        )
    return Token(Kind.LITERAL, text, start, end, value)


def _string(source: str, start: int) -> Token:
    quote = source[start]
    chars: list[str] = []
    position = start + 1
    while position < len(source):
        char = source[position]
        if char == quote:
            return Token(
                Kind.LITERAL, source[start : position + 1], start, position + 1, "".join(chars)
            )
        if char == "\n":
            break
        if char == "\\":
            escaped = source[position + 1 : position + 2]
            if escaped in ("", "\n"):
                break
            if escaped not in _ESCAPES:
                raise ConditionSyntaxError(
                    f"Unknown escape \\{escaped} in string (use \\\\, \\\", \\', \\n, \\t or \\r)",
                    source,
                    position,
                    position + 2,
                )
            chars.append(_ESCAPES[escaped])
            position += 2
            continue
        chars.append(char)
        position += 1
    raise ConditionSyntaxError("Unterminated string", source, start, position)
