"""What the YAML compiles to: the model other packages read, warnings, the graph."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path

from routemaster.config import (
    Action,
    ConstantNext,
    ContextNext,
    ContextNextDestination,
    EntryTrigger,
    Gate,
    IntervalTrigger,
    LoggingPlugin,
    MetadataTimezone,
    MetadataTrigger,
    NamedTimezone,
    NoNext,
    RetryPolicy,
    SystemTimezone,
    TimeTrigger,
    WebhookHeaderRule,
    config_warnings,
    describe_machine,
    load_config,
)

CONFIG = """\
state_machines:
  user:
    feeds:
      - {name: jacquard, url: "http://feeds/<state_machine>/<label>"}
    webhooks:
      - match: 'hooks\\.example'
        headers: {Authorization: Bearer t, X-Team: growth}
    retry: {max_attempts: 5, initial_delay: 2s, max_delay: 1h, multiplier: 3, timeout: 20s}
    states:
      - gate: start
        triggers:
          - metadata: profile.email
          - interval: 1d2h3m4s
          - time: 18h30m
          - time: "07:05"
            timezone: Europe/London
          - time: 9h
            timezone: metadata.user.tz
          - event: entry
        exit_condition: metadata.profile.email is defined and feeds.jacquard.ok
        next: welcome
      - action: welcome
        webhook: http://hooks.example/welcome/<label>
        retry: {max_attempts: 2}
        next:
          type: context
          path: metadata.plan
          default: free
          destinations:
            - {value: pro, state: paid}
            - {value: 2, state: paid}
      - gate: free
        exit_condition: true
        next: {type: constant, state: paid}
      - gate: paid
        exit_condition: false
plugins:
  logging:
    - class: routemaster.logging:PythonLogger
      kwargs: {log_level: INFO}
"""


def _load(write: Callable[..., Path]) -> tuple[Gate, Action, Gate, Gate]:
    machine = load_config([write(CONFIG)]).get_machine("user")
    start, welcome, free, paid = machine.states
    assert isinstance(start, Gate) and isinstance(welcome, Action)
    assert isinstance(free, Gate) and isinstance(paid, Gate)
    return start, welcome, free, paid


def test_triggers_compile_to_typed_values(write: Callable[..., Path]) -> None:
    start, *_ = _load(write)
    assert start.triggers == (
        MetadataTrigger(("profile", "email")),
        IntervalTrigger(datetime.timedelta(days=1, hours=2, minutes=3, seconds=4)),
        TimeTrigger(datetime.time(18, 30), SystemTimezone()),
        TimeTrigger(datetime.time(7, 5), NamedTimezone("Europe/London")),
        TimeTrigger(datetime.time(9), MetadataTimezone(("metadata", "user", "tz"))),
        EntryTrigger(),
    )
    assert start.exit_condition.feeds == frozenset({"jacquard"})


def test_next_rules_and_booleans(write: Callable[..., Path]) -> None:
    start, welcome, free, paid = _load(write)
    assert start.next_states == ConstantNext("welcome")
    assert welcome.next_states == ContextNext(
        path=("metadata", "plan"),
        default="free",
        destinations=(ContextNextDestination("pro", "paid"), ContextNextDestination(2, "paid")),
    )
    assert free.next_states == ConstantNext("paid")
    assert paid.next_states == NoNext()
    assert (free.exit_condition.source, paid.exit_condition.source) == ("true", "false")


def test_machine_settings_and_action_retry_override(write: Callable[..., Path]) -> None:
    config = load_config([write(CONFIG)])
    user = config.get_machine("user")
    assert user.retry == RetryPolicy(
        max_attempts=5,
        initial_delay=datetime.timedelta(seconds=2),
        max_delay=datetime.timedelta(hours=1),
        multiplier=3.0,
        timeout=datetime.timedelta(seconds=20),
    )
    welcome = user.get_state("welcome")
    assert isinstance(welcome, Action)
    assert welcome.retry.max_attempts == 2
    assert welcome.retry.timeout == datetime.timedelta(seconds=20)  # the machine's
    assert user.webhooks == (
        WebhookHeaderRule("hooks\\.example", (("Authorization", "Bearer t"), ("X-Team", "growth"))),
    )
    assert user.feed("jacquard").url == "http://feeds/<state_machine>/<label>"
    assert user.signing_secret is None
    assert config.logging_plugins == (
        LoggingPlugin("routemaster.logging:PythonLogger", (("log_level", "INFO"),)),
    )


def test_defaults_when_nothing_is_said(write: Callable[..., Path]) -> None:
    path = write(
        "state_machines:\n  m:\n    states:\n      - action: a\n        webhook: http://h\n"
    )
    machine = load_config([path]).get_machine("m")
    assert machine.retry == RetryPolicy()
    assert machine.states[0] == Action("a", "http://h", NoNext(), RetryPolicy())


def test_config_warnings_name_the_state(write: Callable[..., Path]) -> None:
    path = write(
        """\
        state_machines:
          user:
            states:
              - gate: start
                exit_condition: metadata.a and metadata.b or metadata.c
                next: clear
              - gate: clear
                exit_condition: metadata.a and (metadata.b or metadata.c)
        """
    )
    [warning] = config_warnings(load_config([path]))
    assert warning.startswith("state_machines.user.states.0.exit_condition: line 1: 'and' and 'or'")


def test_describe_machine_is_json_safe_with_edges(write: Callable[..., Path]) -> None:
    user = load_config([write(CONFIG)]).get_machine("user")
    graph = describe_machine(user)
    assert json.loads(json.dumps(graph)) == graph
    assert graph["name"] == "user"
    assert graph["feeds"] == [{"name": "jacquard", "url": "http://feeds/<state_machine>/<label>"}]
    start, welcome, _, paid = graph["states"]
    assert start["kind"] == "gate" and start["webhook"] is None
    assert start["exit_condition"] == user.states[0].exit_condition.source  # type: ignore[union-attr]
    assert start["triggers"][3] == {"kind": "time", "time": "07:05:00", "timezone": "Europe/London"}
    assert start["triggers"][1] == {"kind": "interval", "seconds": 93784.0}
    assert welcome["kind"] == "action" and welcome["exit_condition"] is None
    assert welcome["webhook"] == "http://hooks.example/welcome/<label>"
    assert welcome["next"]["type"] == "context" and welcome["end"] is False
    assert paid["end"] is True and paid["next"] == {"type": "none"}
    assert graph["edges"] == [
        {"from": "start", "to": "welcome", "kind": "constant"},
        {"from": "welcome", "to": "paid", "kind": "context", "value": "pro"},
        {"from": "welcome", "to": "paid", "kind": "context", "value": 2},
        {"from": "welcome", "to": "free", "kind": "default"},
        {"from": "free", "to": "paid", "kind": "constant"},
    ]
