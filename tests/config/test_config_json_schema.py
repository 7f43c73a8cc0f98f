"""The shape of the configuration: unknown keys, missing keys, wrong types, with places."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from routemaster.config import ConfigProblem, load_config
from routemaster.config.json_schema import SCHEMA

STATES = """\
state_machines:
  user:
    states:
{states}
"""


@pytest.fixture
def one_problem(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> Callable[[str], tuple[ConfigProblem, Path]]:
    """Load the states given (indented to fit) and return the single problem found."""

    def one_problem(states: str) -> tuple[ConfigProblem, Path]:
        indented = "\n".join("      " + line for line in states.strip("\n").splitlines())
        path = write(STATES.format(states=indented))
        found = problems(path)
        assert len(found) == 1, found
        return found[0], path

    return one_problem


def test_unknown_key_points_at_the_key(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]], line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """
- gate: start
  exit_condition: true
  exit_conditon: false
"""
    )
    assert problem.path == "state_machines.user.states.0.exit_conditon"
    assert (problem.line, problem.column) == (line_of(path, "exit_conditon"), 9)
    assert problem.message == (
        "unknown key 'exit_conditon' (expected one of: gate, triggers, exit_condition, next,"
        " outcome)"
    )


def test_unknown_top_level_key(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    path = write("state_machine:\n  user: {}\n")
    found = sorted(problems(path), key=lambda p: p.message)
    assert [(p.path, p.line, p.message) for p in found] == [
        ("", None, "missing required key 'state_machines'"),
        (
            "state_machine",
            1,
            "unknown key 'state_machine' (expected one of: state_machines, plugins, placeholders, "
            "api, receivers, subscriptions, retention)",
        ),
    ]


def test_missing_required_key(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]], line_of: Callable[..., int]
) -> None:
    problem, path = one_problem("- action: notify\n  next: notify\n")
    assert problem.path == "state_machines.user.states.0"
    assert problem.line == line_of(path, "action: notify")
    assert problem.message.startswith("an action needs exactly one of webhook")


def test_wrong_type(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]], line_of: Callable[..., int]
) -> None:
    problem, path = one_problem("- gate: start\n  exit_condition: 3\n")
    assert problem.path == "state_machines.user.states.0.exit_condition"
    assert problem.line == line_of(path, "exit_condition")
    assert problem.message == "expected a condition (text), true or false, got the number 3"


def test_a_state_must_be_a_gate_or_an_action(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]], line_of: Callable[..., int]
) -> None:
    problem, path = one_problem("- gate: start\n  exit_condition: true\n- step: two\n")
    assert problem.path == "state_machines.user.states.1"
    assert problem.line == line_of(path, "step: two")
    assert problem.message == (
        "expected a state: a mapping with a 'gate', an 'action' or a 'spawn' key, got a mapping"
        " with keys step"
    )


def test_unknown_trigger_kind(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]], line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        "- gate: start\n  exit_condition: true\n  triggers:\n    - cron: '* * * * *'\n"
    )
    assert problem.path == "state_machines.user.states.0.triggers.0"
    assert problem.line == line_of(path, "cron")
    assert problem.message == (
        "expected a trigger: one of metadata, interval, time or event, got a mapping with keys cron"
    )


def test_event_trigger_accepts_only_entry_or_timer(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]],
) -> None:
    problem, _ = one_problem(
        "- gate: start\n  exit_condition: true\n  triggers:\n    - event: exit\n"
    )
    assert problem.path == "state_machines.user.states.0.triggers.0.event"
    assert problem.message == "expected 'entry' or 'timer', got the text 'exit'"


def test_next_with_an_unknown_type(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]], line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        "- gate: start\n  exit_condition: true\n  next:\n    type: random\n    state: start\n"
    )
    assert problem.path == "state_machines.user.states.0.next.type"
    assert problem.line == line_of(path, "type: random")
    assert problem.message == "expected 'constant' or 'context', got the text 'random'"


def test_context_next_needs_its_keys(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]],
) -> None:
    problem, _ = one_problem(
        "- gate: start\n  exit_condition: true\n  next:\n    type: context\n"
        "    path: metadata.x\n    default: start\n"
    )
    assert problem.path == "state_machines.user.states.0.next"
    assert problem.message == "missing required key 'destinations'"


def test_durations_must_be_text(
    one_problem: Callable[[str], tuple[ConfigProblem, Path]],
) -> None:
    problem, _ = one_problem(
        "- action: notify\n  webhook: http://x\n  retry: {timeout: 30, max_attempts: 2}\n"
    )
    assert problem.path == "state_machines.user.states.0.retry.timeout"
    assert problem.message == (
        "expected a duration such as 30s, 10m or 1h30m (as text), got the number 30"
    )


def test_a_machine_needs_states(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    [problem] = problems(write("state_machines:\n  user:\n    states: []\n"))
    assert (problem.path, problem.line) == ("state_machines.user.states", 3)
    assert problem.message == "must not be empty"


def test_the_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


API_CONFIG = """\
state_machines:
  user:
    states:
      - gate: start
        exit_condition: false
{api}"""


@pytest.mark.parametrize(
    ("api", "tokens"),
    [
        ("", False),
        ("api: {}\n", False),
        ("api:\n  authentication: none\n", False),
        ("api:\n  authentication: tokens\n", True),
    ],
)
def test_api_authentication_is_none_unless_tokens_are_asked_for(
    write: Callable[..., Path], api: str, tokens: bool
) -> None:
    config = load_config([write(API_CONFIG.format(api=api))])
    assert config.api.tokens_required is tokens


def test_api_authentication_names_the_choices(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    path = write(API_CONFIG.format(api="api:\n  authentication: token\n  tls: true\n"))
    found = sorted((p.path, p.line, p.message) for p in problems(path))
    assert found == [
        ("api.authentication", 7, "expected 'none' or 'tokens', got the text 'token'"),
        ("api.tls", 8, "unknown key 'tls' (expected one of: authentication)"),
    ]
