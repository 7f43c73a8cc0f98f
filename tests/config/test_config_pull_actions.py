"""``worker: {lease}`` actions and ``async_timeout``: compiled, and checked with locations."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest

from routemaster.config import load_config
from routemaster.config.errors import ConfigProblem
from routemaster.config.model import Action, PullWorker

Write = Callable[..., Path]
Problems = Callable[..., list[ConfigProblem]]

CONFIG = """
state_machines:
  jobs:
    states:
      - action: build
        {action}
        next: done
      - gate: done
        exit_condition: false
"""


def test_a_pull_action_compiles_with_its_lease(write: Write) -> None:
    config = load_config([write(CONFIG.format(action="worker: {lease: 1h30m}"))])
    action = config.get_machine("jobs").get_state("build")
    assert isinstance(action, Action)
    assert action.worker == PullWorker(lease=datetime.timedelta(hours=1, minutes=30))
    assert action.webhook is None
    assert action.pulled


def test_async_timeout_goes_with_a_webhook(write: Write) -> None:
    text = CONFIG.format(action="webhook: http://h/x\n        async_timeout: 10m")
    action = load_config([write(text)]).get_machine("jobs").get_state("build")
    assert isinstance(action, Action)
    assert action.async_timeout == datetime.timedelta(minutes=10)
    assert not action.pulled


@pytest.mark.parametrize(
    ("action", "path", "needle", "message"),
    [
        (
            "worker: {lease: 0s}",
            "state_machines.jobs.states.0.worker.lease",
            "lease",
            "a lease must be from 1s to 24h",
        ),
        (
            "worker: {lease: 1d1s}",
            "state_machines.jobs.states.0.worker.lease",
            "lease",
            "a lease must be from 1s to 24h",
        ),
        (
            "worker: {lease: soon}",
            "state_machines.jobs.states.0.worker.lease",
            "lease",
            "expected a duration",
        ),
        (
            "worker: {}",
            "state_machines.jobs.states.0.worker",
            "worker",
            "missing required key 'lease'",
        ),
        (
            "webhook: http://h/x\n        worker: {lease: 30s}",
            "state_machines.jobs.states.0",
            "action: build",
            "exactly one of webhook",
        ),
        (
            "worker: {lease: 30s}\n        async_timeout: 5m",
            "state_machines.jobs.states.0.async_timeout",
            "async_timeout",
            "async_timeout goes with a webhook",
        ),
        (
            "webhook: http://h/x\n        async_timeout: 2d",
            "state_machines.jobs.states.0.async_timeout",
            "async_timeout",
            "from 1s to 24h",
        ),
    ],
)
def test_mistakes_name_the_file_path_and_line(
    write: Write,
    problems: Problems,
    line_of: Callable[..., int],
    action: str,
    path: str,
    needle: str,
    message: str,
) -> None:
    config = write(CONFIG.format(action=action))
    [problem] = problems(config)
    assert problem.file == str(config)
    assert problem.path == path
    assert problem.line == line_of(config, needle)
    assert message in problem.message
