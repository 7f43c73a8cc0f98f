"""``subscriptions: allow``: regular expressions on origins, checked at load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from routemaster.config import ConfigProblem, load_config

Write = Callable[..., Path]
Problems = Callable[..., list[ConfigProblem]]

MACHINES = """\
state_machines:
  user:
    states:
      - gate: start
        exit_condition: true
"""


def test_allow_patterns_are_compiled_into_the_model(write: Write) -> None:
    path = write(MACHINES + "subscriptions:\n  allow: ['^http://127\\.0\\.0\\.1:', 'internal']\n")
    assert load_config([path]).subscriptions.allow == ("^http://127\\.0\\.0\\.1:", "internal")
    assert load_config([write(MACHINES)]).subscriptions.allow == ()


def test_an_allow_pattern_must_be_a_regex(
    write: Write, problems: Problems, line_of: Callable[..., int]
) -> None:
    path = write(MACHINES + "subscriptions:\n  allow:\n    - 'http://(a'\n")
    [problem] = problems(path)
    assert problem.path == "subscriptions.allow.0"
    assert problem.line == line_of(path, "http://(a")
    assert problem.message.startswith("invalid regular expression 'http://(a': missing )")


def test_subscriptions_takes_only_allow(write: Write, problems: Problems) -> None:
    [problem] = problems(write(MACHINES + "subscriptions:\n  deny: []\n"))
    assert problem.path == "subscriptions.deny"
    assert "unknown key 'deny'" in problem.message
