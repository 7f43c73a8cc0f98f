"""``worker: {lease}`` actions and ``async_timeout``: compiled, and checked with locations."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest

from routemaster.config import load_config
from routemaster.config.model import Action, PercentileLease, PullWorker
from routemaster.config.problems import ConfigProblem

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


def test_a_percentile_lease_and_an_at_most_once_lease_compile(write: Write) -> None:
    text = CONFIG.format(action="worker: {lease: {percentile: 99.5, min: 30s, max: 20m}}")
    action = load_config([write(text)]).get_machine("jobs").get_state("build")
    assert isinstance(action, Action)
    lease = PercentileLease(
        percentile=99.5, min=datetime.timedelta(seconds=30), max=datetime.timedelta(minutes=20)
    )
    assert action.worker == PullWorker(lease=lease)
    assert action.worker.longest_lease == datetime.timedelta(minutes=20)
    text = CONFIG.format(action="worker: {lease: 2m, at_most_once: true}")
    action = load_config([write(text)]).get_machine("jobs").get_state("build")
    assert isinstance(action, Action)
    assert action.worker == PullWorker(lease=datetime.timedelta(minutes=2), at_most_once=True)


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
            "worker: {lease: {percentile: 0, min: 1s, max: 1m}}",
            "state_machines.jobs.states.0.worker.lease.percentile",
            "lease",
            "",
        ),
        (
            "worker: {lease: {percentile: 101, min: 1s, max: 1m}}",
            "state_machines.jobs.states.0.worker.lease.percentile",
            "lease",
            "",
        ),
        (
            "worker: {lease: {percentile: 95, min: 1s}}",
            "state_machines.jobs.states.0.worker.lease",
            "lease",
            "missing required key 'max'",
        ),
        (
            "worker: {lease: {percentile: 95, min: 10m, max: 1m}}",
            "state_machines.jobs.states.0.worker.lease.max",
            "lease",
            "max must be at least min",
        ),
        (
            "worker: {lease: {percentile: 95, min: 0s, max: 1m}}",
            "state_machines.jobs.states.0.worker.lease.min",
            "lease",
            "a lease must be from 1s to 24h",
        ),
        (
            "worker: {lease: 5, at_most_once: true}",
            "state_machines.jobs.states.0.worker.lease",
            "lease",
            "expected a duration such as 30s, or {percentile",
        ),
        (
            "worker: {lease: {percentile: 95, min: 1s, max: 1m}, at_most_once: true}",
            "state_machines.jobs.states.0.worker.at_most_once",
            "lease",
            "at_most_once needs a fixed lease",
        ),
        (
            "worker: {lease: 1m, at_most_once: yes please}",
            "state_machines.jobs.states.0.worker.at_most_once",
            "lease",
            "",
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
