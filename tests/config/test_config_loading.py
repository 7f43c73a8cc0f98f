"""Reading YAML safely, layering files, placeholders: and where problems are reported."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from routemaster.config import (
    Action,
    ConfigError,
    ConfigProblem,
    ConstantNext,
    Gate,
    TimeTrigger,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
state_machines:
  user:
    states:
      - gate: start
        exit_condition: metadata.done
        next: end
      - gate: end
        exit_condition: false
"""


def test_example_yaml_loads() -> None:
    config = load_config([REPO / "example.yaml"])
    order = config.get_machine("order")
    assert order.initial_state.name == "awaiting_payment"
    assert config.sources == (str(REPO / "example.yaml"),)


def test_unsafe_python_tag_is_rejected_with_its_place(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    path = write(
        """\
        state_machines:
          user: !!python/object/apply:os.system ["echo pwned"]
        """
    )
    [problem] = problems(path)
    assert (problem.file, problem.line) == (str(path), 2)
    assert problem.message.startswith("unsupported YAML tag !!python/object/apply:os.system")


def test_explicit_tags_that_json_cannot_hold_are_rejected(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    path = write(MINIMAL + "placeholders:\n  day: !!timestamp 2024-01-01\n")
    [problem] = problems(path)
    assert (problem.path, problem.line) == ("placeholders.day", 10)
    assert "unsupported value of type date" in problem.message


def test_yaml_syntax_error_names_the_line(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    path = write("state_machines:\n  user: [1, 2\n")
    [problem] = problems(path)
    assert problem.file == str(path)
    assert problem.line == 3
    assert problem.message.startswith("invalid YAML: expected ',' or ']'")


def test_duplicate_yaml_keys_are_an_error(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    path = write(MINIMAL.replace("next: end", "next: end\n        next: start"))
    [problem] = problems(path)
    assert problem.path == "state_machines.user.states.0.next"
    assert problem.line == line_of(path, "next: start")
    assert problem.message == f"duplicate key 'next' (first given on line {problem.line - 1})"


def test_missing_and_empty_files(
    tmp_path: Path, write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    [missing] = problems(tmp_path / "absent.yaml")
    assert missing.file == str(tmp_path / "absent.yaml")
    assert missing.message.startswith("cannot read file:")
    [empty] = problems(write("# nothing\n"))
    assert empty.message == "the configuration is empty"


def test_top_level_must_be_a_mapping(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    [problem] = problems(write("- a\n- b\n"))
    assert problem.message == "the top level must be a mapping, got a list"


def test_times_and_dates_stay_text(write: Callable[..., Path]) -> None:
    """YAML 1.1 would read 18:30 as the number 1110 and 2024-01-01 as a date."""
    path = write(
        MINIMAL.replace(
            "exit_condition: metadata.done",
            "exit_condition: metadata.done\n        triggers: [{time: 18:30}]",
        ).replace(
            "next: end",
            "next:\n          type: context\n          path: metadata.day\n"
            "          default: end\n          destinations:\n"
            "            - {value: 2024-01-01, state: end}",
        )
    )
    gate = load_config([path]).state_machines[0].states[0]
    assert isinstance(gate, Gate)
    trigger = gate.triggers[0]
    assert isinstance(trigger, TimeTrigger)
    assert trigger.time.isoformat() == "18:30:00"
    assert gate.next_states.destinations[0].value == "2024-01-01"  # type: ignore[union-attr]


def test_layers_deep_merge_maps_and_replace_everything_else(write: Callable[..., Path]) -> None:
    base = write(
        """\
        state_machines:
          user:
            retry: {max_attempts: 3, timeout: 5s}
            feeds:
              - {name: one, url: http://one}
            states:
              - gate: start
                exit_condition: metadata.done
                next: end
              - gate: end
                exit_condition: false
        """,
        "base.yaml",
    )
    layer = write(
        """\
        state_machines:
          user:
            retry: {max_attempts: 7}
            feeds:
              - {name: two, url: http://two}
          other:
            states:
              - gate: only
                exit_condition: true
        """,
        "layer.yaml",
    )
    config = load_config([base, layer])
    user = config.get_machine("user")
    assert (user.retry.max_attempts, user.retry.timeout.total_seconds()) == (7, 5.0)
    assert [feed.name for feed in user.feeds] == ["two"]
    assert [machine.name for machine in config.state_machines] == ["user", "other"]
    assert config.sources == (str(base), str(layer))


def test_layered_problems_name_the_file_the_value_came_from(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    base = write(MINIMAL, "base.yaml")
    layer = write(
        """\
        # the layer replaces the states list, with a mistake in it
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: metadata.done
                next: nowhere
        """,
        "layer.yaml",
    )
    [problem] = problems(base, layer)
    assert problem.file == str(layer)
    assert problem.path == "state_machines.user.states.0.next"
    assert problem.line == line_of(layer, "next: nowhere")
    assert problem.message.startswith("no state called 'nowhere' in state machine 'user'")


def test_a_merged_map_keeps_each_keys_own_file(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    base = write(MINIMAL.replace("metadata.done", "metadata.done =="), "base.yaml")
    layer = write("state_machines:\n  user:\n    retry: {timeout: soon}\n", "layer.yaml")
    found = {problem.path: problem for problem in problems(base, layer)}
    condition = found["state_machines.user.states.0.exit_condition"]
    assert (condition.file, condition.line) == (str(base), line_of(base, "metadata.done"))
    timeout = found["state_machines.user.retry.timeout"]
    assert (timeout.file, timeout.line) == (str(layer), 3)


def test_placeholders_are_substituted(write: Callable[..., Path]) -> None:
    path = write(
        """\
        placeholders:
          root: https://hooks.example.com
          attempts: 4
        state_machines:
          user:
            retry:
              max_attempts: "{placeholders.attempts}"
            states:
              - action: notify
                webhook: "{placeholders.root}/notify?tries={placeholders.attempts}"
                next: end
              - gate: end
                exit_condition: false
        """
    )
    user = load_config([path]).get_machine("user")
    assert user.retry.max_attempts == 4  # a whole-string placeholder keeps its type
    notify = user.states[0]
    assert notify.webhook == "https://hooks.example.com/notify?tries=4"  # type: ignore[union-attr]
    assert notify.next_states == ConstantNext("end")


def test_unknown_placeholder_is_an_error(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    path = write(
        """\
        placeholders:
          root: https://hooks.example.com
        state_machines:
          user:
            states:
              - action: notify
                webhook: "{placeholders.rot}/notify"
        """
    )
    [problem] = problems(path)
    assert problem.path == "state_machines.user.states.0.webhook"
    assert problem.line == line_of(path, "webhook:")
    assert problem.message == "unknown placeholder 'rot' (known: root)"


def test_every_mistake_is_reported_in_file_order(
    write: Callable[..., Path], line_of: Callable[..., int]
) -> None:
    path = write(
        """\
        state_machines:
          user:
            states:
              - gate: start
                triggers:
                  - interval: 90 minutes
                exit_condition: metadata.ready == true
                next: finish
              - gate: end
                exit_condition: false
                colour: blue
        """
    )
    with pytest.raises(ConfigError) as raised:
        load_config([path])
    found = [(p.file, p.path, p.line) for p in raised.value.problems]
    assert found == [
        (str(path), "state_machines.user.states.0.triggers.0.interval", line_of(path, "interval")),
        (str(path), "state_machines.user.states.0.exit_condition", line_of(path, "ready ==")),
        (str(path), "state_machines.user.states.0.next", line_of(path, "next: finish")),
        (str(path), "state_machines.user.states.1.colour", line_of(path, "colour")),
    ]
    lines = str(raised.value).splitlines()
    assert len(lines) == 4
    assert lines[0].startswith(f"{path}:{line_of(path, 'interval')}:")
    assert lines[0].endswith(
        "state_machines.user.states.0.triggers.0.interval: expected a duration such as"
        " 30s, 10m, 1h30m or 1d, got '90 minutes'"
    )


def test_anchors_and_merge_keys(write: Callable[..., Path]) -> None:
    path = write(
        """\
        state_machines:
          user:
            retry: &quick {max_attempts: 4, timeout: 3s}
            states:
              - action: first
                webhook: http://hooks/first
                retry:
                  <<: *quick
                  max_attempts: 2
                next: second
              - action: second
                webhook: http://hooks/second
                retry: *quick
        """
    )
    first, second = load_config([path]).get_machine("user").states
    assert isinstance(first, Action) and isinstance(second, Action)
    assert (first.retry.max_attempts, first.retry.timeout.total_seconds()) == (2, 3.0)
    assert (second.retry.max_attempts, second.retry.timeout.total_seconds()) == (4, 3.0)
