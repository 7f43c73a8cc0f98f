"""Semantic rules: one fixture per rule, each asserting file, path, line and message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from routemaster.config import ConfigProblem, load_config

Load = Callable[..., tuple[ConfigProblem, Path]]


@pytest.fixture
def one_problem(write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]) -> Load:
    """``one_problem(yaml, environ=None)``: the only problem the configuration has."""

    def one_problem(text: str, environ: dict[str, str] | None = None) -> tuple[ConfigProblem, Path]:
        path = write(text)
        found = problems(path, environ=environ)
        assert len(found) == 1, found
        assert found[0].file == str(path)
        return found[0], path

    return one_problem


def test_state_names_are_letters_digits_underscores(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: needs-review
                exit_condition: false
        """
    )
    assert problem.path == "state_machines.user.states.0.gate"
    assert (problem.line, problem.column) == (line_of(path, "needs-review"), 9)
    assert problem.message == (
        "invalid state name 'needs-review': use letters, digits and underscores only"
    )


def test_state_names_are_unique(one_problem: Load, line_of: Callable[..., int]) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
                next: start
              - action: start
                webhook: http://hooks/start
        """
    )
    assert problem.path == "state_machines.user.states.1.action"
    assert problem.line == line_of(path, "action: start")
    assert problem.message == "duplicate state name 'start' (also states.0)"


@pytest.mark.parametrize(
    ("next_yaml", "suffix"),
    [
        ("next: finish", "next"),
        ("next: {type: constant, state: finish}", "next.state"),
        (
            "next: {type: context, path: metadata.x, default: finish, destinations: []}",
            "next.default",
        ),
        (
            "next: {type: context, path: metadata.x, default: end,"
            " destinations: [{value: 1, state: finish}]}",
            "next.destinations.0.state",
        ),
    ],
)
def test_every_destination_exists(
    one_problem: Load, line_of: Callable[..., int], next_yaml: str, suffix: str
) -> None:
    problem, path = one_problem(
        f"""\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
                {next_yaml}
              - gate: end
                exit_condition: false
        """
    )
    assert problem.path == f"state_machines.user.states.0.{suffix}"
    assert problem.line == line_of(path, "next:")
    assert (
        problem.message == "no state called 'finish' in state machine 'user' (states: start, end)"
    )


def test_every_state_is_reachable_from_the_first(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
                next: end
              - gate: island
                exit_condition: true
                next: end
              - gate: end
                exit_condition: false
        """
    )
    assert problem.path == "state_machines.user.states.1"
    assert (problem.line, problem.column) == (line_of(path, "gate: island"), 9)
    assert problem.message == "state 'island' cannot be reached from the first state 'start'"


def test_context_destinations_count_as_edges(write: Callable[..., Path]) -> None:
    path = write(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
                next:
                  type: context
                  path: metadata.kind
                  default: a
                  destinations: [{value: x, state: b}]
              - gate: a
                exit_condition: false
              - gate: b
                exit_condition: false
        """
    )
    assert len(load_config([path]).state_machines[0].states) == 3


def test_exit_condition_syntax_error_points_into_the_condition(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: |
                  metadata.ready
                    and metadata.count == 3
        """
    )
    assert problem.path == "state_machines.user.states.0.exit_condition"
    line = line_of(path, "metadata.count == 3")
    column = path.read_text().splitlines()[line - 1].index("==") + 1
    assert (problem.line, problem.column) == (line, column)
    assert problem.message == (
        "invalid exit condition: error on line 2 of the condition:"
        " Unknown operator == (did you mean =?) (at '==')"
    )


def test_exit_condition_error_in_a_quoted_one_line_condition(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: "metadata.a != 1"
        """
    )
    text = path.read_text().splitlines()[line_of(path, "!=") - 1]
    assert (problem.line, problem.column) == (line_of(path, "!="), text.index("!=") + 1)
    assert "error on line 1 of the condition: Unknown operator != (did you mean /=?)" in (
        problem.message
    )


def test_lookups_start_with_metadata_feeds_history_or_system(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: metdata.ready
        """
    )
    assert problem.path == "state_machines.user.states.0.exit_condition"
    assert problem.line == line_of(path, "metdata.ready")
    assert (
        "Unknown path metdata.ready: a lookup starts with metadata, feeds, history or system"
        in (problem.message)
    )


def test_conditions_read_only_configured_feeds(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            feeds:
              - {name: jacquard, url: http://feeds/<label>}
            states:
              - gate: start
                exit_condition: |
                  metadata.ready
                  and feeds.jaquard.enabled
        """
    )
    assert problem.path == "state_machines.user.states.0.exit_condition"
    line = line_of(path, "feeds.jaquard")
    column = path.read_text().splitlines()[line - 1].index("feeds.") + 1
    assert (problem.line, problem.column) == (line, column)
    assert problem.message == (
        "the exit condition reads feeds.jaquard but the state machine has no feed called"
        " 'jaquard' (feeds: jacquard)"
    )


def test_feed_names_are_unique(one_problem: Load, line_of: Callable[..., int]) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            feeds:
              - name: jacquard
                url: http://feeds/a
              - name: jacquard
                url: http://feeds/b
            states:
              - gate: start
                exit_condition: feeds.jacquard.on
        """
    )
    assert problem.path == "state_machines.user.feeds.1.name"
    assert problem.line == line_of(path, "name: jacquard", 2)
    assert problem.message == "duplicate feed name 'jacquard' (also feeds.0)"


@pytest.mark.parametrize(
    ("trigger", "key", "message"),
    [
        (
            "{interval: 1 hour}",
            "interval",
            "expected a duration such as 30s, 10m, 1h30m or 1d, got '1 hour'",
        ),
        ("{interval: 0m}", "interval", "the interval must be longer than zero"),
        ("{time: 24h}", "time", "expected a time of day such as 18h30m or \"18:30\", got '24h'"),
        (
            "{time: '7:75'}",
            "time",
            "expected a time of day such as 18h30m or \"18:30\", got '7:75'",
        ),
        (
            "{time: 18h, timezone: Europe/Lundon}",
            "timezone",
            "unknown time zone 'Europe/Lundon': expected an IANA name such as Europe/London,"
            " or metadata.PATH to read each label's own zone",
        ),
        ("{time: 18h, timezone: metadata..tz}", "timezone", "invalid metadata path 'metadata..tz'"),
        (
            "{metadata: ''}",
            "metadata",
            "expected a path in the metadata such as payment.status, got ''",
        ),
        (
            "{metadata: 'a..b'}",
            "metadata",
            "expected a path in the metadata such as payment.status, got 'a..b'",
        ),
    ],
)
def test_trigger_formats(
    one_problem: Load, line_of: Callable[..., int], trigger: str, key: str, message: str
) -> None:
    problem, path = one_problem(
        f"""\
        state_machines:
          user:
            states:
              - gate: start
                triggers:
                  - {trigger}
                exit_condition: true
        """
    )
    assert problem.path == f"state_machines.user.states.0.triggers.0.{key}"
    assert problem.line == line_of(path, "- {")
    assert problem.message == message


@pytest.mark.parametrize(
    ("path_text", "message"),
    [
        (
            "user.variant",
            "expected a path starting with metadata, feeds, history (such as metadata.variant),"
            " got 'user.variant'",
        ),
        (
            "feeds.nope.variant",
            "reads feeds.nope but the state machine has no feed called 'nope' (feeds: none)",
        ),
    ],
)
def test_context_transition_paths(
    one_problem: Load, line_of: Callable[..., int], path_text: str, message: str
) -> None:
    problem, path = one_problem(
        f"""\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
                next:
                  type: context
                  path: {path_text}
                  default: start
                  destinations: []
        """
    )
    assert problem.path == "state_machines.user.states.0.next.path"
    assert problem.line == line_of(path, "path:")
    assert problem.message == message


def test_duplicate_destination_values(one_problem: Load, line_of: Callable[..., int]) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
                next:
                  type: context
                  path: metadata.n
                  default: start
                  destinations:
                    - {value: true, state: start}
                    - {value: 1, state: start}
                    - {value: 1.0, state: start}
        """
    )
    assert problem.path == "state_machines.user.states.0.next.destinations.2.value"
    assert problem.line == line_of(path, "value: 1.0")
    assert problem.message == "duplicate destination value 1.0 (also destinations.1)"


def test_webhook_match_must_be_a_regex(one_problem: Load, line_of: Callable[..., int]) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            webhooks:
              - match: 'hooks\\.example\\.com/(v1'
                headers: {Authorization: Bearer x}
            states:
              - gate: start
                exit_condition: true
        """
    )
    assert problem.path == "state_machines.user.webhooks.0.match"
    assert problem.line == line_of(path, "match:")
    assert problem.message.startswith(
        "invalid regular expression 'hooks\\\\.example\\\\.com/(v1': missing )"
    )


def test_webhook_and_feed_urls_are_http(one_problem: Load, line_of: Callable[..., int]) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - action: start
                webhook: hooks.example.com/start
        """
    )
    assert problem.path == "state_machines.user.states.0.webhook"
    assert problem.line == line_of(path, "webhook:")
    assert problem.message == "expected an http:// or https:// URL, got 'hooks.example.com/start'"


def test_logging_plugin_class_is_module_colon_class(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: true
        plugins:
          logging:
            - class: routemaster.logging.PythonLogger
        """
    )
    assert problem.path == "plugins.logging.0.class"
    assert problem.line == line_of(path, "class:")
    assert problem.message == (
        "expected module.path:ClassName, got 'routemaster.logging.PythonLogger'"
    )


SIGNED = """\
state_machines:
  user:
    {signing}
    states:
      - action: start
        webhook: http://hooks/start
"""


def test_signing_secret_from_the_environment(write: Callable[..., Path]) -> None:
    path = write(SIGNED.format(signing="signing_secret_env: HOOK_SECRET"))
    config = load_config([path], environ={"HOOK_SECRET": "s3cret"})
    assert config.get_machine("user").signing_secret == "s3cret"


def test_signing_secret_variable_must_be_set(
    one_problem: Load, line_of: Callable[..., int]
) -> None:
    problem, path = one_problem(SIGNED.format(signing="signing_secret_env: HOOK_SECRET"))
    assert problem.path == "state_machines.user.signing_secret_env"
    assert problem.line == line_of(path, "signing_secret_env")
    assert problem.message == (
        "environment variable HOOK_SECRET (the signing secret) is not set or empty"
    )


def test_signing_secret_given_twice(one_problem: Load) -> None:
    problem, _ = one_problem(
        SIGNED.format(signing="signing_secret: a\n    signing_secret_env: HOOK_SECRET"),
        environ={"HOOK_SECRET": "b"},
    )
    assert problem.path == "state_machines.user.signing_secret_env"
    assert problem.message == "give signing_secret or signing_secret_env, not both"


@pytest.mark.parametrize(
    ("retry", "key", "message"),
    [
        (
            "{initial_delay: soon}",
            "initial_delay",
            "expected a duration such as 30s, 10m, 1h30m or 1d, got 'soon'",
        ),
        ("{timeout: 0s}", "timeout", "the timeout must be longer than zero"),
        (
            "{initial_delay: 1h, max_delay: 1m}",
            "initial_delay",
            "initial_delay is longer than max_delay",
        ),
    ],
)
def test_retry_durations(
    one_problem: Load, line_of: Callable[..., int], retry: str, key: str, message: str
) -> None:
    problem, path = one_problem(
        f"""\
        state_machines:
          user:
            states:
              - action: start
                webhook: http://hooks/start
                retry: {retry}
        """
    )
    assert problem.path == f"state_machines.user.states.0.retry.{key}"
    assert problem.line == line_of(path, "retry:")
    assert problem.message == message


@pytest.mark.parametrize(
    "condition",
    [
        ">\n          metadata.a\n          and metadata.b == 3",
        ">\n          metadata.a\n          and metadata.b == 3\n\n        next: start",
        ">-\n          metadata.a\n\n          and metadata.b == 3",
        "metadata.a\n          and metadata.b == 3",
        '"metadata.a\n          and metadata.b == 3"',
        "'metadata.a and metadata.b == 3'",
    ],
    ids=["folded", "folded-then-blank", "folded-strip", "plain", "double-quoted", "single-quoted"],
)
def test_condition_errors_are_located_in_folded_values(
    one_problem: Load, line_of: Callable[..., int], condition: str
) -> None:
    problem, path = one_problem(
        "state_machines:\n  user:\n    states:\n      - gate: start\n"
        f"        exit_condition: {condition}\n"
    )
    line = line_of(path, "==")
    assert (problem.line, problem.column) == (
        line,
        path.read_text().splitlines()[line - 1].index("==") + 1,
    )


def test_an_empty_exit_condition_is_a_problem_not_a_crash(one_problem: Load) -> None:
    problem, _ = one_problem(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: ""
        """
    )
    assert problem.path == "state_machines.user.states.0.exit_condition"
    assert "invalid exit condition" in problem.message
