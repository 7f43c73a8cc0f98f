"""``flow:`` on actions (SPEC G2): compiled with its default name, and every mistake reported
with its file, path and line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from routemaster.config import load_config
from routemaster.config.model import Action, Flow
from routemaster.config.problems import ConfigProblem

Write = Callable[..., Path]
Problems = Callable[..., list[ConfigProblem]]
LineOf = Callable[..., int]

CONFIG = """
state_machines:
  pay:
    states:
      - action: charge
        webhook: http://example.com/charge/<label>
        flow: {first}
        next: refund
      - action: refund
        worker: {{lease: 30s}}
        flow: {second}
        next: done
      - gate: done
        exit_condition: false
"""


def _action(path: Path, name: str) -> Action:
    action = load_config([path]).get_machine("pay").get_state(name)
    assert isinstance(action, Action)
    return action


def test_flows_compile_and_an_unnamed_one_is_named_after_its_action(write: Write) -> None:
    path = write(
        CONFIG.format(
            first="{key: metadata.customer.id, concurrency: 3, weight: metadata.tier, name: cash}",
            second="{key: metadata.customer.id}",
        )
    )
    assert _action(path, "charge").flow == Flow(
        name="cash", key=("customer", "id"), concurrency=3, weight=("tier",)
    )
    assert _action(path, "refund").flow == Flow(name="pay.refund", key=("customer", "id"))


def test_a_bad_path_or_cap_names_file_path_and_line(
    write: Write, problems: Problems, line_of: LineOf
) -> None:
    path = write(
        CONFIG.format(
            first="{key: customer.id, concurrency: 0}",
            second="{key: metadata.id, weight: 'metadata..w', nope: 1}",
        )
    )
    found = {problem.path: problem for problem in problems(path)}
    key = found["state_machines.pay.states.0.flow.key"]
    assert "expected a metadata path" in key.message and key.line == line_of(path, "customer.id")
    cap = found["state_machines.pay.states.0.flow.concurrency"]
    assert "at least 1" in cap.message and cap.line == line_of(path, "concurrency: 0")
    weight = found["state_machines.pay.states.1.flow.weight"]
    assert weight.file == str(path) and weight.line == line_of(path, "metadata..w")
    assert "unknown key 'nope'" in found["state_machines.pay.states.1.flow.nope"].message


def test_one_flow_named_with_two_caps_is_an_error(
    write: Write, problems: Problems, line_of: LineOf
) -> None:
    path = write(
        CONFIG.format(
            first="{key: metadata.id, concurrency: 2, name: shared}",
            second="{key: metadata.id, concurrency: 3, name: shared}",
        )
    )
    [problem] = problems(path)
    assert problem.path == "state_machines.pay.states.1.flow.concurrency"
    assert problem.file == str(path) and problem.line == line_of(path, "concurrency: 3")
    assert "flow 'shared' has concurrency 2" in problem.message
