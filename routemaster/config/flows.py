"""``flow:`` on actions (SPEC G2): its name, its key and weight paths, and the one rule the
schema cannot state, that every action naming one flow gives it the same ``concurrency``.

The schema checks the shape (the paths' syntax, ``concurrency >= 1``); this module names a
flow (``SM.STATE`` when it has no ``name``) and compiles it. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from routemaster.config.model import Flow
from routemaster.config.problems import ConfigProblem
from routemaster.config.source import ConfigPath, SourceMap


def flow_name(machine: str, state: str, flow: dict[str, Any]) -> str:
    """The flow's name: its own, or ``SM.STATE`` (one action's alone)."""
    name = flow.get("name")
    return name if isinstance(name, str) else f"{machine}.{state}"


def compile_flow(machine: str, state: str, flow: dict[str, Any]) -> Flow:
    weight = flow.get("weight")
    return Flow(
        name=flow_name(machine, state, flow),
        key=tuple(flow["key"].split(".")[1:]),
        concurrency=flow.get("concurrency"),
        weight=tuple(weight.split(".")[1:]) if isinstance(weight, str) else None,
    )


def flow_problems(machines: Any, source: SourceMap) -> list[ConfigProblem]:
    """A flow named by several actions with different ``concurrency`` (absent is no cap)."""
    first: dict[str, tuple[ConfigPath, Any]] = {}
    problems: list[ConfigProblem] = []
    for path, name, flow in _flows(machines):
        concurrency = flow.get("concurrency")
        seen = first.setdefault(name, (path, concurrency))
        if seen[1] != concurrency:
            where = (*path, "concurrency") if "concurrency" in flow else path
            problems.append(
                source.problem(
                    where,
                    f"flow {name!r} has concurrency {_shown(seen[1])} at "
                    f"{'.'.join(map(str, seen[0]))}: every action naming a flow must give it "
                    f"the same concurrency (got {_shown(concurrency)})",
                )
            )
    return problems


def _shown(concurrency: Any) -> str:
    return "none (no cap)" if concurrency is None else repr(concurrency)


def _flows(machines: Any) -> Iterator[tuple[ConfigPath, str, dict[str, Any]]]:
    if not isinstance(machines, dict):
        return
    for machine_name, machine in machines.items():
        states = machine.get("states") if isinstance(machine, dict) else None
        for index, state in enumerate(states if isinstance(states, list) else []):
            if not isinstance(state, dict) or not isinstance(state.get("flow"), dict):
                continue
            flow = state["flow"]
            action = state.get("action")
            name = flow_name(str(machine_name), str(action), flow)
            yield ("state_machines", machine_name, "states", index, "flow"), name, flow
