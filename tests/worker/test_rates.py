"""A receiver's rate as arithmetic: how many calls go now, and when more may (pure)."""

from __future__ import annotations

import datetime

from routemaster.config.receiver_rules import parse_rate
from routemaster.service.delivery_claims import next_rate_at, rate_allows

NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)


def test_an_idle_rate_lets_a_tenth_of_a_second_go_at_once_then_spaces_calls() -> None:
    rate = parse_rate("100/s")
    assert rate is not None
    allowed, _ = rate_allows(rate, None, NOW)
    assert allowed == 10
    after = next_rate_at(rate, None, NOW, 10)
    assert after == NOW + datetime.timedelta(seconds=0.1)
    none_now, wake_at = rate_allows(rate, after, NOW)
    assert none_now == 0
    assert wake_at > NOW
    assert rate_allows(rate, after, wake_at)[0] >= 1


def test_over_a_long_window_the_calls_match_the_rate() -> None:
    rate = parse_rate("5/10s")
    assert rate is not None
    rate_at, now, calls = None, NOW, 0
    while now < NOW + datetime.timedelta(minutes=10):
        allowed, wake_at = rate_allows(rate, rate_at, now)
        if allowed > 0:
            calls += allowed
            rate_at = next_rate_at(rate, rate_at, now, allowed)
        else:
            now = wake_at
    assert 300 <= calls <= 301  # 5 per 10 s for 10 minutes, plus the tolerance
