"""The worker's round is one table: each step runs on its schedule, in order, alone in failing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import sqlalchemy as sa

from routemaster.worker.round import EVERY_ROUND, STEPS, Round, Step, Work, seconds


@dataclass
class _Work:
    """What a round needs of :class:`Work`: the stop flag and the step runner."""

    app: Any = None
    stopping: threading.Event = field(default_factory=threading.Event)
    ran: list[str] = field(default_factory=list)

    def step(self, name: str, work: Callable[[], Any], failed: Any) -> Any:
        self.ran.append(name)
        try:
            return work()
        except sa.exc.SQLAlchemyError:
            return failed


def _round(work: _Work, *steps: Step) -> Round:
    return Round(cast(Work, work), steps)


def _fails(_: Any) -> None:
    raise sa.exc.OperationalError("SELECT 1", {}, Exception("statement timeout"))


def test_every_kind_of_work_is_one_named_row() -> None:
    names = [step.name for step in STEPS]
    assert len(names) == len(set(names))
    assert [step.name for step in STEPS if step.every is EVERY_ROUND] == [
        "1.x jobs",
        "moving delivered labels",
        "claiming deliveries",
        "evaluating due gates",
        "waking parents",
        "spawning and deciding",
        "bulk commands",
    ]


def test_scheduled_steps_wait_for_their_time_and_all_run_in_the_first_round() -> None:
    work = _Work()
    steps = (
        Step("hourly", seconds(3600), lambda w: None),
        Step("each round", EVERY_ROUND, lambda w: 1, busy=True),
        Step("at once", seconds(3600), lambda w: None, at_once=True),
    )
    this = _round(work, *steps)
    assert this.run() is True
    assert work.ran == ["each round", "at once"]
    work.ran.clear()
    this.run(all_due=True)
    assert work.ran == ["hourly", "each round", "at once"]
    idle = this.idle_seconds()
    assert idle is not None and 3500 < idle <= 3600


def test_a_failing_step_keeps_none_after_it_waiting_and_may_ask_to_run_again() -> None:
    work = _Work()
    steps = (
        Step("failing", EVERY_ROUND, _fails, busy=True),
        Step("backlog", seconds(3600), _fails, at_once=True, again=lambda w, a: a is None),
        Step("after", EVERY_ROUND, lambda w: 0, busy=True),
    )
    this = _round(work, *steps)
    assert this.run() is False
    assert this.run() is False
    assert work.ran == ["failing", "backlog", "after"] * 2


def test_a_stopping_worker_runs_only_the_draining_steps() -> None:
    work = _Work()
    steps = (
        Step("upkeep", EVERY_ROUND, lambda w: None, draining=True),
        Step("claiming", EVERY_ROUND, lambda w: True, busy=True),
    )
    this = _round(work, *steps)
    work.stopping.set()
    assert this.run() is False
    assert work.ran == ["upkeep"]
