"""What an action does: send a webhook, or wait for a pull worker (``worker: {lease}``).

The schema accepts both keys; these checks say that exactly one is given,
that a lease lies between one second and one day, and that ``async_timeout``
(the callback pattern) goes with a webhook. Pure.
"""

from __future__ import annotations

import datetime
from typing import Any

from routemaster.config.formats import parse_duration
from routemaster.config.problems import ConfigProblem
from routemaster.config.source import ConfigPath, SourceMap

MIN_LEASE = datetime.timedelta(seconds=1)
MAX_LEASE = datetime.timedelta(hours=24)
_HINT = "a duration such as 30s, 10m or 1h30m"


def action_problems(
    path: ConfigPath, action: dict[str, Any], source: SourceMap
) -> list[ConfigProblem]:
    """The mistakes in one action's ``webhook``/``worker``/``async_timeout`` keys."""
    problems: list[ConfigProblem] = []
    has_webhook, has_worker = "webhook" in action, "worker" in action
    if has_webhook == has_worker:
        problems.append(
            source.problem(
                path,
                "an action needs exactly one of webhook (a URL the worker posts to) "
                "or worker (e.g. worker: {lease: 30s}, for pull workers)"
                + (", not both" if has_webhook else ""),
            )
        )
    worker = action.get("worker")
    if isinstance(worker, dict):
        problems.extend(_worker_problems((*path, "worker"), worker, source))
    timeout = action.get("async_timeout")
    if isinstance(timeout, str):
        where = (*path, "async_timeout")
        duration = parse_duration(timeout)
        if duration is None:
            problems.append(source.problem(where, f"expected {_HINT}, got {timeout!r}"))
        elif not MIN_LEASE <= duration <= MAX_LEASE:
            problems.append(source.problem(where, "async_timeout must be from 1s to 24h"))
        elif has_worker:
            problems.append(
                source.problem(where, "async_timeout goes with a webhook, not with worker")
            )
    return problems


def _worker_problems(
    path: ConfigPath, worker: dict[str, Any], source: SourceMap
) -> list[ConfigProblem]:
    """A fixed lease, or a percentile's ``min`` and ``max``: each from 1s to 24h, min <= max.

    ``at_most_once`` needs a fixed lease: a percentile lease is shorter than some
    of the work by design, and each of those would be errored.
    """
    lease = worker.get("lease")
    if isinstance(lease, str):
        return _lease_problems((*path, "lease"), lease, source)[0]
    if not isinstance(lease, dict):
        return []
    problems: list[ConfigProblem] = []
    bounds: dict[str, datetime.timedelta | None] = {}
    for key in ("min", "max"):
        if isinstance(lease.get(key), str):
            found, duration = _lease_problems((*path, "lease", key), lease[key], source)
            problems.extend(found)
            bounds[key] = duration
    low, high = bounds.get("min"), bounds.get("max")
    if low is not None and high is not None and low > high:
        problems.append(
            source.problem((*path, "lease", "max"), "max must be at least min (a lease's bounds)")
        )
    if worker.get("at_most_once") is True:
        problems.append(
            source.problem(
                (*path, "at_most_once"),
                "at_most_once needs a fixed lease (lease: 5m): with a percentile lease, "
                "the slower tasks would be errored",
            )
        )
    return problems


def _lease_problems(
    path: ConfigPath, text: str, source: SourceMap
) -> tuple[list[ConfigProblem], datetime.timedelta | None]:
    lease = parse_duration(text)
    if lease is None:
        return [source.problem(path, f"expected {_HINT}, got {text!r}")], None
    if not MIN_LEASE <= lease <= MAX_LEASE:
        return [source.problem(path, "a lease must be from 1s to 24h")], None
    return [], lease
