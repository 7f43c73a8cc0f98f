"""``retention:``: top level and per machine, checked with file, path and line, compiled."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest

from routemaster.config import ConfigProblem, load_config
from routemaster.config.model import Retention

MACHINE = """\
state_machines:
  m:
    {machine_retention}
    states:
      - gate: start
        exit_condition: false
  other:
    states:
      - gate: start
        exit_condition: false
"""


def test_no_retention_keeps_everything(write: Callable[..., Path]) -> None:
    config = load_config([write(MACHINE.format(machine_retention=""))])
    assert config.retention == Retention()
    assert all(m.retention == Retention() for m in config.state_machines)


def test_a_machine_overrides_the_top_level_key_by_key(write: Callable[..., Path]) -> None:
    text = "retention:\n  history: 180d\n  deleted: 30d\n" + MACHINE.format(
        machine_retention="retention: {deleted: 2d, finished: 90d}"
    )
    config = load_config([write(text)])
    day = datetime.timedelta(days=1)
    assert config.get_machine("m").retention == Retention(180 * day, 2 * day, 90 * day)
    assert config.get_machine("other").retention == Retention(180 * day, 30 * day, None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "expected a duration such as 180d, 36h or 30m, got 'soon'"),
        ("0d", "must be longer than zero, got '0d'"),
        (30, "expected a duration such as 180d, 36h or 30m (as text), got the number 30"),
    ],
)
def test_a_bad_duration_is_located(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
    value: object,
    message: str,
) -> None:
    path = write(MACHINE.format(machine_retention=f"retention:\n      finished: {value}"))
    (problem,) = problems(path)
    assert (problem.file, problem.path) == (str(path), "state_machines.m.retention.finished")
    assert problem.line == line_of(path, "finished:")
    assert problem.message == message


def test_an_unknown_key_is_named(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    path = write("retention:\n  labels: 30d\n" + MACHINE.format(machine_retention=""))
    (problem,) = problems(path)
    assert problem.path == "retention.labels"
    assert problem.line == 2
    assert "unknown key 'labels' (expected one of: history, deleted, finished)" in problem.message
