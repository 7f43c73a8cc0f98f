"""The compiled SQL: values and paths only ever travel as bound parameters; refusals point."""

from __future__ import annotations

import datetime
import re

import pytest

from routemaster.exit_conditions import ConditionSyntaxError
from routemaster.search import compile_search

NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    "source",
    [
        'metadata.zzqq_x = "zz\'); DROP TABLE labels; --"',
        "metadata.zzqq_x.zzqq-y > 'zz\\\" OR 1=1 --'",
        "\"zz' || pg_sleep(10) || '\" is in metadata.zzqq_x",
        'metadata.zzqq_x < "zz$$ ; $$"',
        'history.previous_state = "zz:sm" and system.label = "zz%(sm)s"',
    ],
)
def test_no_value_or_path_is_written_into_the_sql(source: str) -> None:
    compiled = compile_search(source, NOW)
    assert "zz" not in compiled.sql
    assert "DROP" not in compiled.sql and "pg_sleep" not in compiled.sql
    # The driver formats the statement: its only % are the condition's own parameters.
    assert "%" not in re.sub(r"%\(w\d+\)s", "", compiled.sql)
    assert set(re.findall(r"%\((\w+)\)s", compiled.sql)) == set(compiled.params)
    assert any("zz" in str(value) for value in compiled.params.values())


@pytest.mark.parametrize(
    ("source", "message", "marked"),
    [
        ("feeds.payments.status = 1", "cannot read feeds", "feeds.payments.status"),
        (
            "metadata.a and metadata.b or metadata.c",
            "parentheses",
            "metadata.a and metadata.b or metadata.c",
        ),
        ("metadata.paid_at < system.now", "as times", "metadata.paid_at < system.now"),
        (
            "1d has passed since metadata.shipped_at",
            "as times",
            "1d has passed since metadata.shipped_at",
        ),
        ("metadata.t >= 12:30", "as times", "metadata.t >= 12:30"),
        ("metadata.x = 9007199254740993.5", "below", "metadata.x = 9007199254740993.5"),
    ],
)
def test_refusals_mark_the_clause(source: str, message: str, marked: str) -> None:
    with pytest.raises(ConditionSyntaxError) as raised:
        compile_search(source, NOW)
    error = raised.value
    assert message in error.message
    lines = str(error).splitlines()
    assert lines[0].startswith("Error on line 1: ")
    start = source.index(marked)
    assert lines[2] == " " * start + "~" * len(marked)


def test_a_mix_inside_parentheses_is_clear_and_accepted() -> None:
    compile_search("metadata.a and (metadata.b or metadata.c)", NOW)
    compile_search("(metadata.a and metadata.b) or metadata.c", NOW)


def test_constants_fold_and_moments_are_parameters() -> None:
    assert compile_search("1 < 2 and true", NOW).sql == "TRUE"
    assert compile_search("not (1 < 2)", NOW).sql == "FALSE"
    compiled = compile_search("1d has passed since history.entered_state", NOW)
    assert compiled.params == {"w0": NOW - datetime.timedelta(days=1)}
