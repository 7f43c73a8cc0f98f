"""What the delivery log keeps of a call: redacted URLs, bounded excerpts, Retry-After, outcomes."""

from __future__ import annotations

import datetime

from routemaster.http.calls import excerpt, outcome_of, redact_url, retry_after

NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)


def test_userinfo_and_query_values_are_redacted() -> None:
    assert (
        redact_url("https://alice:s3cret@hooks.example.com:8443/a/b?token=abc&x=1&flag#frag")
        == "https://REDACTED@hooks.example.com:8443/a/b?token=REDACTED&x=REDACTED&flag"
    )
    assert redact_url("http://example.com/plain") == "http://example.com/plain"


def test_the_excerpt_is_the_first_kib_as_text() -> None:
    assert excerpt(b"x" * 5000) == "x" * 1024
    assert excerpt(b"ok\x00\xff") == "ok\ufffd"  # NUL dropped, invalid UTF-8 replaced


def test_retry_after_in_seconds_or_as_a_date_for_429_and_503_only() -> None:
    headers = {"Retry-After": "120"}
    assert retry_after(429, headers, NOW) == datetime.timedelta(seconds=120)
    assert retry_after(503, headers, NOW) == datetime.timedelta(seconds=120)
    assert retry_after(500, headers, NOW) is None
    dated = {"Retry-After": "Tue, 24 Nov 2026 12:05:00 GMT"}
    assert retry_after(503, dated, NOW) == datetime.timedelta(minutes=5)
    assert retry_after(429, {"Retry-After": "9999999"}, NOW) == datetime.timedelta(days=1)
    assert retry_after(429, {"Retry-After": "soon"}, NOW) is None
    assert retry_after(429, {}, NOW) is None


def test_outcomes_by_status() -> None:
    assert [outcome_of(s) for s in (200, 204, 410, 429, 500, 302, 400)] == [
        "delivered",
        "delivered",
        "gone",
        "throttled",
        "failed",
        "failed",
        "failed",
    ]
