"""Receivers: each origin outbound calls reach, and the ``receivers:`` rules that tune them.

An origin (``scheme://host[:port]``) is one receiver, named by a URL-safe
id. The first rule whose ``match`` (a regular expression searched in the
origin) finds it gives its limits; an origin no rule matches gets the
defaults. Pure: the checks, the compiled model and the mapping from a
configuration's URL templates to receivers.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import regex

from routemaster.config.formats import parse_duration
from routemaster.config.patterns import pattern_problems
from routemaster.config.source import ConfigPath

_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*(s|m|h|d)\s*")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNSAFE = re.compile(r"[^a-z0-9.]+")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` calls per ``period``, spread evenly (a small burst tolerated)."""

    count: int
    period: datetime.timedelta

    @property
    def interval(self) -> float:
        """Seconds between calls at the full rate."""
        return self.period.total_seconds() / self.count

    def __str__(self) -> str:
        return f"{self.count}/{int(self.period.total_seconds())}s"


@dataclass(frozen=True)
class Circuit:
    failures: int = 10  # consecutive failures (timeout, network, 5xx, 429) that open it
    cooldown: datetime.timedelta = datetime.timedelta(seconds=30)  # open, before a probe
    give_up_after: datetime.timedelta = datetime.timedelta(days=1)  # waiting on it, then errored


@dataclass(frozen=True)
class ReceiverPolicy:
    match: str | None = None  # None: the defaults, no rule matched
    max_in_flight: int | None = None  # across all workers; None: only the workers' slots
    rate: Rate | None = None
    circuit: Circuit = field(default_factory=Circuit)


SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["match"],
        "properties": {
            "match": {"type": "string"},
            "max_in_flight": {"type": "integer", "minimum": 1},
            "rate": {
                "type": "string",
                "x-messages": {"type": 'expected a rate such as "100/s", "20/m" or "5/10s"'},
            },
            "circuit": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "failures": {"type": "integer", "minimum": 1},
                    "cooldown": {"type": "string"},
                    "give_up_after": {"type": "string"},
                },
            },
        },
    },
}
"""The ``receivers:`` section's shape (part of the configuration's JSON Schema)."""


def parse_rate(text: str) -> Rate | None:
    """``100/s``, ``20/m``, ``5/10s`` → :class:`Rate`; ``None`` when malformed or zero."""
    match = _RATE.fullmatch(text)
    if match is None:
        return None
    count, multiple, unit = int(match.group(1)), int(match.group(2) or 1), match.group(3)
    if count < 1 or multiple < 1:
        return None
    return Rate(count, datetime.timedelta(seconds=multiple * _UNITS[unit]))


def receiver_problems(rules: Any, urls: list[str]) -> list[tuple[ConfigPath, str]]:
    """What the schema cannot say about ``receivers:``: patterns (tried on the origins of the
    configured ``urls``), rates, durations."""
    problems: list[tuple[ConfigPath, str]] = []
    origins = sorted({origin_of(url) for url in urls})
    if not isinstance(rules, list):
        return problems
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        path: ConfigPath = ("receivers", index)
        if isinstance(rule.get("match"), str):
            for problem in pattern_problems(rule["match"], origins):
                problems.append(((*path, "match"), problem))
        rate = rule.get("rate")
        if isinstance(rate, str) and parse_rate(rate) is None:
            problems.append(
                ((*path, "rate"), f'expected a rate such as "100/s" or "5/10s", got {rate!r}')
            )
        circuit = rule.get("circuit")
        if isinstance(circuit, dict):
            for key in ("cooldown", "give_up_after"):
                text = circuit.get(key)
                if isinstance(text, str) and not parse_duration(text):
                    problems.append(
                        (
                            (*path, "circuit", key),
                            f"expected a duration such as 30s, 10m, 1h30m or 1d, got {text!r}",
                        )
                    )
    return problems


def compile_receivers(rules: list[dict[str, Any]]) -> tuple[ReceiverPolicy, ...]:
    """The checked ``receivers:`` rules, in order."""
    compiled = []
    defaults = Circuit()
    for rule in rules:
        circuit = rule.get("circuit", {})
        cooldown = parse_duration(circuit.get("cooldown", "")) or defaults.cooldown
        give_up = parse_duration(circuit.get("give_up_after", "")) or defaults.give_up_after
        compiled.append(
            ReceiverPolicy(
                match=rule["match"],
                max_in_flight=rule.get("max_in_flight"),
                rate=parse_rate(rule["rate"]) if "rate" in rule else None,
                circuit=Circuit(
                    failures=circuit.get("failures", defaults.failures),
                    cooldown=cooldown,
                    give_up_after=give_up,
                ),
            )
        )
    return tuple(compiled)


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL or URL template, lower case, the port as written.

    A template whose host holds ``<label>`` keeps the placeholder: all its
    labels' calls count as one receiver.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = parts.netloc.rpartition("@")[2].lower()
    default_port = {"http": ":80", "https": ":443"}.get(scheme)
    if default_port and host.endswith(default_port):
        host = host[: -len(default_port)]
    return f"{scheme}://{host}"


def receiver_id(origin: str) -> str:
    """A URL-safe id: ``http://api.example.com:8080`` → ``http-api.example.com-8080``."""
    return _UNSAFE.sub("-", origin.lower().replace("://", "-")).strip("-") or "none"


def policy_for(rules: tuple[ReceiverPolicy, ...], origin: str) -> ReceiverPolicy:
    """The first rule whose ``match`` is found in ``origin``, or the defaults."""
    for rule in rules:
        assert rule.match is not None
        try:
            if regex.search(rule.match, origin, timeout=0.1):
                return rule
        except TimeoutError:  # checked against the configured origins at load: not those
            continue
    return ReceiverPolicy()


def url_templates(machine: dict[str, Any]) -> list[str]:
    """Every URL template of the machine (feeds, action webhooks): what header rules match."""
    feeds = [feed.get("url") for feed in _listed(machine.get("feeds")) if isinstance(feed, dict)]
    hooks = [
        state.get("webhook") for state in _listed(machine.get("states")) if isinstance(state, dict)
    ]
    return [url for url in (*feeds, *hooks) if isinstance(url, str)]


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
