"""1.x's periodic jobs: what the plugins' ``process_cron`` wraps, on 1.x's schedule.

1.x's worker was a scheduler of jobs per state; plugins count them
(``cron_jobs_processed`` by ``fn_name``, machine and state) and dashboards
and alerts are built on those counts. This worker is driven by events
instead (a label due, a slot free), but keeps the same jobs, each a sweep of
one state, so ``process_cron`` keeps its meaning:

- each action state with a webhook, once a minute: ``process_action`` around
  claiming the state's due deliveries (which slots then send; a delivery's own
  failure is told through ``process_webhook`` and ``exception``). A pull action
  (``worker:``) has no job: worker processes claim its labels through ``/tasks``;
- each metadata trigger of a gate, once a minute: ``process_gate`` around
  evaluating the gate's due labels (those whose evaluation is to be retried);
- interval and time triggers as they fire: ``process_gate`` around the firing
  and the evaluation of the gate's labels it made due
  (:mod:`~routemaster.worker.clock_triggers`).

"Once a minute" is each time the worker's clock enters a new minute, and at
start. Each worker runs its own jobs, as each 1.x process ran its own.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from routemaster.app import App
from routemaster.config.model import Action, Config, Gate, MetadataTrigger, State, StateMachine

PROCESS_ACTION = "process_action"
PROCESS_GATE = "process_gate"


@dataclass(frozen=True)
class Sweep:
    """One 1.x job: a state, and 1.x's name for what is done to it."""

    machine: StateMachine
    state: State
    fn_name: str

    @property
    def key(self) -> tuple[str, str]:
        return self.machine.name, self.state.name


def minutely_sweeps(config: Config) -> Iterator[Sweep]:
    """1.x's jobs that run every minute: one per webhook action, one per metadata trigger."""
    for machine in config.state_machines:
        for state in machine.states:
            if isinstance(state, Action):
                if not state.pulled:
                    yield Sweep(machine, state, PROCESS_ACTION)
            elif isinstance(state, Gate):
                for trigger in state.triggers:
                    if isinstance(trigger, MetadataTrigger):
                        yield Sweep(machine, state, PROCESS_GATE)


class Minutely:
    """Runs every minutely sweep, inside the plugins' ``process_cron``, once per minute."""

    def __init__(self, app: App, run: Callable[[Sweep], None]) -> None:
        self._app = app
        self._run = run
        self.sweeps = list(minutely_sweeps(app.config))
        self._minute: datetime.datetime | None = None

    def run_pending(self) -> None:
        minute = self._app.now().replace(second=0, microsecond=0)
        if minute == self._minute:
            return
        self._minute = minute
        for sweep in self.sweeps:
            with self._app.hooks.cron(sweep.machine, sweep.state, sweep.fn_name):
                self._run(sweep)
