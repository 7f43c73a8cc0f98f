"""How long to wait before retrying a failed action (pure): webhooks and pull tasks alike."""

from __future__ import annotations

import datetime
import random

from routemaster.config.model import RetryPolicy


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random) -> datetime.timedelta:
    """The delay after failed attempt number ``attempt`` (1-based), with equal jitter.

    Exponential growth capped at ``max_delay``; half of it fixed and half
    random ("equal jitter"), so retries after a receiver outage spread out
    instead of arriving together, yet never come back almost at once.
    """
    exponent = min(max(attempt - 1, 0), 64)  # past 2**64 the cap applies anyway
    seconds = policy.initial_delay.total_seconds() * policy.multiplier**exponent
    capped = min(policy.max_delay.total_seconds(), seconds)
    return datetime.timedelta(seconds=capped / 2 + rng.uniform(0, capped / 2))
