"""Spawn states and ``outcome`` (SPEC G3) checked at load time, each problem with its place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from routemaster.config import ConfigProblem, load_config
from routemaster.config.model import Spawn
from tests.worker.children import config

Problems = Callable[..., list[ConfigProblem]]


def test_a_spawn_state_compiles_with_its_wait(write: Callable[..., Path]) -> None:
    for wait, at_least in (("all", None), ("any", 1), ("{at_least: 2}", 2)):
        loaded = load_config([write(config(wait=wait, on_exit="delete"))])
        spawn = loaded.get_machine("order").get_state("pick")
        assert isinstance(spawn, Spawn)
        assert (spawn.machine, spawn.for_each, spawn.at_least) == (
            "item",
            ("metadata", "items"),
            at_least,
        )
        assert spawn.on_exit_delete
        assert loaded.get_machine("item").get_state("picked").outcome == "succeeded"


def _one(problems: Problems, path: Path) -> ConfigProblem:
    found = problems(path)
    assert len(found) == 1, found
    return found[0]


def test_an_unknown_child_machine_is_named_with_its_place(
    write: Callable[..., Path], problems: Problems, line_of: Callable[..., int]
) -> None:
    path = write(config(on_exit="delete", items_machine="itme"))
    problem = _one(problems, path)
    assert problem.path == "state_machines.order.states.0.machine"
    assert problem.line == line_of(path, "machine: itme")
    assert problem.file == str(path)
    assert "no state machine called 'itme'" in problem.message


def test_for_each_must_be_a_path_in_the_metadata(
    write: Callable[..., Path], problems: Problems, line_of: Callable[..., int]
) -> None:
    path = write(config(on_exit="delete").replace("metadata.items", "feeds.items"))
    problem = _one(problems, path)
    assert problem.path == "state_machines.order.states.0.for_each"
    assert problem.line == line_of(path, "for_each:")
    assert "expected a path in the metadata" in problem.message


def test_at_least_must_be_one_or_more(
    write: Callable[..., Path], problems: Problems, line_of: Callable[..., int]
) -> None:
    path = write(config(wait="{at_least: 0}", on_exit="delete"))
    problem = _one(problems, path)
    assert problem.path == "state_machines.order.states.0.wait.at_least"
    assert problem.line == line_of(path, "at_least")
    assert problem.message == "at_least must be 1 or more, got the number 0"


def test_an_unknown_wait_is_refused(write: Callable[..., Path], problems: Problems) -> None:
    problem = _one(problems, write(config(wait="most", on_exit="delete")))
    assert problem.path == "state_machines.order.states.0.wait"
    assert problem.message == "expected all, any or {at_least: N}, got the text 'most'"


def test_next_reads_only_the_children_counts(
    write: Callable[..., Path], problems: Problems
) -> None:
    problem = _one(
        problems, write(config(on_exit="delete").replace("children.failed", "children.best"))
    )
    assert problem.path == "state_machines.order.states.0.next.path"
    assert "children.total, children.succeeded" in problem.message


def test_an_outcome_on_a_state_with_no_way_in_is_refused(
    write: Callable[..., Path], problems: Problems, line_of: Callable[..., int]
) -> None:
    exit_line = "        exit_condition: metadata.ok = true or metadata.bad = true\n"
    text = config(on_exit="delete").replace(exit_line, exit_line + "        outcome: failed\n")
    path = write(text)
    problem = _one(problems, path)
    assert problem.path == "state_machines.item.states.0.outcome"
    assert problem.line == line_of(path, "outcome: failed")
    assert "no state leads into it" in problem.message
