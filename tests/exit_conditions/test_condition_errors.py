"""Compile errors: the message, where it points, and how it is rendered."""

from __future__ import annotations

import pytest

from routemaster.exit_conditions import ConditionSyntaxError, compile_condition

# (source, message, line, column, the rendered source line and marker)
ERRORS = [
    (
        "metadata.x = 1 and\nmetadata.a == 3 and\nmetadata.b",
        "Unknown operator == (did you mean =?)",
        2,
        12,
        "metadata.a == 3 and\n           ~~",
    ),
    (
        "metadata.a != 3",
        "Unknown operator != (did you mean /=?)",
        1,
        12,
        "metadata.a != 3\n           ~~",
    ),
    (
        "metadata.a => 3",
        "Unknown operator => (did you mean >=?)",
        1,
        12,
        "metadata.a => 3\n           ~~",
    ),
    ("true || false", "Unknown operator || (did you mean or?)", 1, 6, "true || false\n     ~~"),
    ("metadata.a @ 3", "Unexpected character '@'", 1, 12, "metadata.a @ 3\n           ~"),
    ("'abc", "Unterminated string", 1, 1, "'abc\n~~~~"),
    (
        'metadata.a = "ab\nc"',
        "Unterminated string",
        1,
        14,
        'metadata.a = "ab\n             ~~~',
    ),
    (
        '"a\\qb"',
        "Unknown escape \\q in string (use \\\\, \\\", \\', \\n, \\t or \\r)",
        1,
        3,
        '"a\\qb"\n  ~~',
    ),
    (
        "metadata.a and",
        "Expected a value after 'and', found the end of the condition",
        1,
        15,
        "metadata.a and\n              ~",
    ),
    (
        "metadata.a and # trailing comment\n\n",
        "Expected a value after 'and', found the end of the condition",
        1,
        15,
        "metadata.a and # trailing comment\n              ~",
    ),
    ("= 3", "Expected a value, found '='", 1, 1, "= 3\n~"),
    (
        "metadata.a\n\tand or true",
        "Expected a value after 'and', found 'or'",
        2,
        6,
        "\tand or true\n\t    ~~",
    ),
    (
        "(metadata.a = 1 or\n metadata.b",
        "Missing ')' to close the '(' at line 1, column 1; found the end of the condition",
        2,
        12,
        " metadata.b\n           ~",
    ),
    ("metadata.a)", "Unmatched ')'", 1, 11, "metadata.a)\n          ~"),
    (
        "metadata.a = 1 = 2",
        "Unexpected '=' (expected and, or, or the end of the condition)",
        1,
        16,
        "metadata.a = 1 = 2\n               ~",
    ),
    ("", "Expected a condition, found nothing", 1, 1, "\n~"),
    (
        "30m1h has passed since system.now",
        "Invalid duration '30m1h' (write e.g. 1d12h, 30m or 1h30m45s: "
        "units d, h, m, s in that order)",
        1,
        1,
        "30m1h has passed since system.now\n~~~~~",
    ),
    (
        "1.5h",
        "Invalid duration '1.5h' (durations use whole numbers, e.g. 1h30m)",
        1,
        1,
        "1.5h\n~~~~",
    ),
    ("-30m", "Invalid number '-30m' (only numbers can be negative)", 1, 1, "-30m\n~~~~"),
    (
        "system.time > 25:00",
        "Invalid time of day '25:00'",
        1,
        15,
        "system.time > 25:00\n              ~~~~~",
    ),
    (
        "system.time > 18:3",
        "Invalid time of day '18:3' (write e.g. 18:30 or 18:30:15)",
        1,
        15,
        "system.time > 18:3\n              ~~~~",
    ),
    ("1000000000d = 1d", "Duration too large: 1000000000d", 1, 1, "1000000000d = 1d\n~~~~~~~~~~~"),
    (
        "metadata.a and foo.bar = 1",
        "Unknown path foo.bar: a lookup starts with metadata, feeds, history or system",
        1,
        16,
        "metadata.a and foo.bar = 1\n               ~~~~~~~",
    ),
    ("True", "Unknown name True (did you mean true?)", 1, 1, "True\n~~~~"),
    (
        "feeds = 1",
        "Expected a feed name: feeds.NAME or feeds.NAME.field",
        1,
        1,
        "feeds = 1\n~~~~~",
    ),
    (
        "history.entered",
        "Unknown path history.entered: history has entered_state, previous_state, current_state",
        1,
        1,
        "history.entered\n~~~~~~~~~~~~~~~",
    ),
    ("metadata.", "Expected a name after '.'", 1, 9, "metadata.\n        ~"),
    (
        "metadata.items.1234567890",
        "List index too large in metadata.items.1234567890",
        1,
        1,
        "metadata.items.1234567890\n~~~~~~~~~~~~~~~~~~~~~~~~~",
    ),
    (
        "metadata.a is 3",
        "Expected 'defined' or 'in' after 'is', found '3'",
        1,
        15,
        "metadata.a is 3\n              ~",
    ),
    (
        "metadata.a has passed since system.now",
        "'has passed since' needs a duration before it, e.g. 1d12h",
        1,
        1,
        "metadata.a has passed since system.now\n~~~~~~~~~~",
    ),
    (
        "1d has since system.now",
        "Expected 'passed' after 'has', found 'since'",
        1,
        8,
        "1d has since system.now\n       ~~~~~",
    ),
    (
        "metadata.a = not true",
        "Expected a value after '=', found 'not'",
        1,
        14,
        "metadata.a = not true\n             ~~~",
    ),
]


@pytest.mark.parametrize(("source", "message", "line", "column", "marked"), ERRORS)
def test_compile_errors(source: str, message: str, line: int, column: int, marked: str) -> None:
    with pytest.raises(ConditionSyntaxError) as raised:
        compile_condition(source)
    error = raised.value
    assert (error.message, error.line, error.column) == (message, line, column)
    assert error.source == source
    assert error.length == marked.rsplit("\n", 1)[1].count("~")
    assert str(error) == f"Error on line {line}: {message}\n{marked}"


def test_huge_numbers_are_compile_errors_with_short_messages() -> None:
    with pytest.raises(ConditionSyntaxError) as raised:
        compile_condition("metadata.a = " + "9" * 5000)
    assert raised.value.message == "Number too large: " + "9" * 27 + "..."
    assert raised.value.length == 5000


@pytest.mark.parametrize(
    ("source", "column"), [("(" * 60 + "true" + ")" * 60, 51), ("not " * 60 + "true", 201)]
)
def test_deep_nesting_is_a_compile_error(source: str, column: int) -> None:
    with pytest.raises(ConditionSyntaxError) as raised:
        compile_condition(source)
    assert raised.value.message == "Nested too deeply (more than 50 levels)"
    assert raised.value.column == column


def test_nesting_within_the_limit_compiles() -> None:
    source = "(" * 48 + "not true" + ")" * 48
    assert compile_condition(source).canonical() == "(not true)"
