"""The ``receivers:`` section: its rules compiled, its mistakes named with file, path and line."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from routemaster.config import ConfigProblem, load_config
from routemaster.config.origins import configured_receivers
from routemaster.config.receiver_rules import Rate, parse_rate, receiver_id

MACHINE = """\
state_machines:
  m:
    feeds: [{name: f, url: "http://feeds.example.com/<label>"}]
    states:
      - action: a
        webhook: "https://user:pw@hooks.example.com:8443/a?x=1"
        next: b
      - action: b
        webhook: "http://hooks.example.com/b"
        next: c
      - gate: c
        exit_condition: feeds.f.done = true
"""


def test_rules_tune_the_receivers_they_match_first_and_others_get_defaults(
    write: Callable[..., Path],
) -> None:
    path = write(
        MACHINE
        + """\
receivers:
  - match: ':8443$'
    max_in_flight: 5
    rate: 100/s
    circuit: {failures: 3, cooldown: 1m, give_up_after: 2h}
  - match: 'example\\.com'
    rate: 5/10s
"""
    )
    receivers = configured_receivers(load_config([path]))
    assert set(receivers) == {
        "https-hooks.example.com-8443",
        "http-hooks.example.com",
        "http-feeds.example.com",
    }
    secure = receivers["https-hooks.example.com-8443"]
    assert secure.origin == "https://hooks.example.com:8443"  # no userinfo in an origin
    assert secure.action_states == (("m", "a"),)
    assert (secure.policy.max_in_flight, secure.policy.rate) == (5, Rate(100, _seconds(1)))
    assert secure.policy.circuit.failures == 3
    assert secure.policy.circuit.cooldown == _seconds(60)
    assert secure.policy.circuit.give_up_after == _seconds(7200)
    plain = receivers["http-hooks.example.com"]
    assert plain.policy.rate == Rate(5, _seconds(10))
    assert plain.policy.max_in_flight is None
    assert plain.policy.circuit.failures == 10  # the default
    assert receivers["http-feeds.example.com"].action_states == ()


def test_a_pull_action_is_no_receivers_so_its_labels_are_never_claimed_for_a_webhook(
    write: Callable[..., Path],
) -> None:
    path = write(
        """\
state_machines:
  m:
    states:
      - action: pulled
        worker: {lease: 30s}
        next: notify
      - action: notify
        webhook: "http://hooks.example.com/n"
        next: done
      - gate: done
        exit_condition: false
"""
    )
    receivers = configured_receivers(load_config([path]))
    assert {ident: r.action_states for ident, r in receivers.items()} == {
        "http-hooks.example.com": (("m", "notify"),)
    }


def test_receiver_ids_are_url_safe_and_default_ports_are_left_out() -> None:
    assert receiver_id("http://[::1]:8080") == "http-1-8080"
    assert receiver_id("https://Api.Example.com") == "https-api.example.com"
    assert parse_rate("100/s") == Rate(100, _seconds(1))
    assert parse_rate("0/s") is None
    assert parse_rate("100 per second") is None


def test_mistakes_are_named_with_their_place(
    write: Callable[..., Path],
    problems: Callable[..., list[ConfigProblem]],
    line_of: Callable[..., int],
) -> None:
    path = write(
        MACHINE
        + """\
receivers:
  - match: '(unclosed'
    rate: fast
    circuit: {failures: 0, cooldown: soon}
    burst: 3
"""
    )
    found = {(problem.path, problem.line): problem.message for problem in problems(path)}
    assert found[("receivers.0.match", line_of(path, "(unclosed"))].startswith(
        "invalid regular expression"
    )
    assert "expected a rate such as" in found[("receivers.0.rate", line_of(path, "fast"))]
    assert "must be at least 1" in found[("receivers.0.circuit.failures", line_of(path, "soon"))]
    assert "expected a duration" in found[("receivers.0.circuit.cooldown", line_of(path, "soon"))]
    assert "unknown key 'burst'" in found[("receivers.0.burst", line_of(path, "burst"))]


def _seconds(n: int) -> datetime.timedelta:
    return datetime.timedelta(seconds=n)
