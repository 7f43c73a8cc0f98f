"""How many request workers ``serve`` starts when not told: one per CPU it may use, 2 to 8."""

from __future__ import annotations

import os

import pytest

from routemaster.server.application import default_workers, usable_cpus, workers_for


def test_web_concurrency_is_taken_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "5")
    assert default_workers() == 5


def test_without_web_concurrency_one_worker_per_usable_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    assert default_workers() == workers_for(usable_cpus())


@pytest.mark.parametrize(("cpus", "workers"), [(1, 2), (2, 2), (3, 3), (8, 8), (64, 8)])
def test_one_worker_per_cpu_at_least_two_at_most_eight(cpus: int, workers: int) -> None:
    assert workers_for(cpus) == workers


def test_the_cpus_counted_are_those_the_process_may_run_on() -> None:
    """A container limited to some CPUs by its cpuset gets as many workers, not the host's."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    assert usable_cpus() == len(os.sched_getaffinity(0))
