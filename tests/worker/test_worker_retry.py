import datetime
import random

from routemaster.config.model import RetryPolicy
from routemaster.machine.retry import backoff

SECOND = datetime.timedelta(seconds=1)


def test_backoff_grows_exponentially_within_equal_jitter() -> None:
    policy = RetryPolicy(initial_delay=SECOND, multiplier=3, max_delay=datetime.timedelta(hours=1))
    rng = random.Random(1)
    for attempt, base in [(1, 1), (2, 3), (3, 9), (4, 27)]:
        delays = [backoff(policy, attempt, rng).total_seconds() for _ in range(200)]
        assert base / 2 <= min(delays)
        assert max(delays) <= base
        assert max(delays) - min(delays) > base / 4  # jittered, not constant


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(initial_delay=SECOND, max_delay=10 * SECOND)
    rng = random.Random(2)
    for attempt in (10, 100, 10_000):
        assert 5 * SECOND <= backoff(policy, attempt, rng) <= 10 * SECOND
