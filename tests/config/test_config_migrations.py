"""``migrations:`` per machine: what is accepted, and each mistake named by file, path and line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from routemaster.config import ConfigProblem, Migration, load_config

_MACHINE = """\
state_machines:
  order:
    states:
      - gate: waiting
        exit_condition: metadata.ready
        next: notify
      - action: notify
        webhook: http://hooks/notify
        next: done
      - gate: done
        exit_condition: false
    migrations:
"""


def test_renames_and_moves_compile_in_order(write: Callable[..., Path]) -> None:
    path = write(
        _MACHINE
        + "      - rename: {from: pending, to: waiting}\n"
        + "      - move: {from: cancelled, to: done}\n"
    )
    machine = load_config([path]).get_machine("order")
    assert machine.migrations == (
        Migration("rename", "pending", "waiting"),
        Migration("move", "cancelled", "done"),
    )
    assert machine.migrations[0].reason == "migration: rename pending -> waiting"


def _problems(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    lines: str,
) -> tuple[list[ConfigProblem], Path]:
    path = write(_MACHINE + lines)
    found = problems(path)
    assert all(problem.file == str(path) for problem in found)
    return found, path


def test_from_must_not_be_a_state(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    found, path = _problems(write, problems, "      - rename: {from: notify, to: done}\n")
    assert [(p.path, p.line) for p in found] == [
        ("state_machines.order.migrations.0.rename.from", line_of(path, "rename:"))
    ]
    assert "still has a state called 'notify'" in found[0].message


def test_to_must_be_a_state(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    found, path = _problems(
        write, problems, "      - move:\n          from: old\n          to: gone\n"
    )
    assert [(p.path, p.line) for p in found] == [
        ("state_machines.order.migrations.0.move.to", line_of(path, "to: gone"))
    ]
    assert found[0].message == (
        "move to 'gone': no state called 'gone' (states: waiting, notify, done)"
    )


def test_a_state_is_migrated_once(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    found, _ = _problems(
        write,
        problems,
        "      - rename: {from: old, to: done}\n      - move: {from: old, to: waiting}\n",
    )
    assert [(p.path, p.message) for p in found] == [
        (
            "state_machines.order.migrations.1.move.from",
            "state 'old' is already migrated by migrations.0",
        )
    ]


def test_the_shape_is_checked(
    write: Callable[..., Path], problems: Callable[..., list[ConfigProblem]]
) -> None:
    found, _ = _problems(write, problems, "      - copy: {from: a, to: done}\n")
    assert [p.path for p in found] == ["state_machines.order.migrations.0"]
    assert "a migration: a mapping with a 'rename' or a 'move' key" in found[0].message
    found, _ = _problems(write, problems, "      - rename: {from: a}\n")
    assert [(p.path, p.message) for p in found] == [
        ("state_machines.order.migrations.0.rename", "missing required key 'to'")
    ]
