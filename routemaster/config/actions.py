"""What an action does: send a webhook, or wait for a pull worker (``worker: {lease}``).

The schema accepts both keys; these checks say that exactly one is given,
that a lease lies between one second and one day, and that ``async_timeout``
(the callback pattern) goes with a webhook. Pure.
"""

from __future__ import annotations

import datetime
from typing import Any

from routemaster.config.errors import ConfigProblem
from routemaster.config.formats import parse_duration
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
    if isinstance(worker, dict) and isinstance(worker.get("lease"), str):
        lease = parse_duration(worker["lease"])
        where = (*path, "worker", "lease")
        if lease is None:
            problems.append(source.problem(where, f"expected {_HINT}, got {worker['lease']!r}"))
        elif not MIN_LEASE <= lease <= MAX_LEASE:
            problems.append(source.problem(where, "a lease must be from 1s to 24h"))
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
