"""Semantic checks: what the schema cannot say (names, the graph, conditions, formats).

Runs on the merged document even when the schema found problems, checking
whatever is well-formed, so that one run reports every mistake. Pure: the
environment is passed in.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from routemaster.config.actions import action_problems
from routemaster.config.children import CHILDREN_COUNTS, outcome_problems, spawn_problems
from routemaster.config.flows import flow_problems
from routemaster.config.formats import (
    CONTEXT_NEXT_ROOTS,
    parse_duration,
    parse_time_of_day,
    same_value,
    split_path,
)
from routemaster.config.migrations import migration_problems, strategy_problems
from routemaster.config.model import Config, Gate
from routemaster.config.patterns import pattern_problems
from routemaster.config.problems import ConfigProblem
from routemaster.config.receiver_rules import receiver_problems, url_templates
from routemaster.config.retention import retention_problems
from routemaster.config.source import ConfigPath, ScalarMark, SourceMap
from routemaster.config.subscription_origins import subscription_problems
from routemaster.exit_conditions import ConditionSyntaxError, Program, compile_condition

_STATE_NAME = re.compile(r"[A-Za-z0-9_]+")
_PLUGIN_CLASS = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_NEVER = datetime.timedelta(0)
_FOREVER = datetime.timedelta.max
_DURATION_HINT = "a duration such as 30s, 10m, 1h30m or 1d"


@dataclass
class Checked:
    """The outcome of the checks, and what they computed that compiling reuses."""

    problems: list[ConfigProblem] = field(default_factory=list)
    conditions: dict[ConfigPath, Program] = field(default_factory=dict)  # by exit_condition path
    secrets: dict[str, str] = field(default_factory=dict)  # machine name -> signing secret


def semantic_problems(document: Any, source: SourceMap, environ: Mapping[str, str]) -> Checked:
    checked = Checked()
    checker = _Checker(source, checked, environ)
    machines = document.get("state_machines") if isinstance(document, dict) else None
    if isinstance(machines, dict):
        checker.machines = {str(name) for name in machines}
        for name, machine in machines.items():
            if isinstance(machine, dict):
                checker.machine(str(name), machine)
    plugins = document.get("plugins") if isinstance(document, dict) else None
    if isinstance(plugins, dict):
        checker.logging_plugins(plugins.get("logging"))
    checked.problems.extend(flow_problems(machines, source))
    for path, problem in subscription_problems(document):
        checker.report(path, problem)
    for path, problem in retention_problems(document):
        checker.report(path, problem)
    if isinstance(document, dict) and isinstance(machines, dict):
        urls = [url for m in machines.values() if isinstance(m, dict) for url in url_templates(m)]
        for path, problem in receiver_problems(document.get("receivers"), urls):
            checker.report(path, problem)
    return checked


def config_warnings(config: Config) -> list[str]:
    """Legal but suspicious configuration: ``and``/``or`` mixed without parentheses."""
    warnings: list[str] = []
    for machine in config.state_machines:
        for index, state in enumerate(machine.states):
            if isinstance(state, Gate):
                where = f"state_machines.{machine.name}.states.{index}.exit_condition"
                warnings.extend(f"{where}: {text}" for text in state.exit_condition.warnings)
    return warnings


class _Checker:
    def __init__(self, source: SourceMap, checked: Checked, environ: Mapping[str, str]) -> None:
        self.source = source
        self.checked = checked
        self.environ = environ

    def report(
        self,
        path: ConfigPath,
        message: str,
        *,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.checked.problems.append(self.source.problem(path, message, line=line, column=column))

    machines: set[str] = set()  # every machine's name: what a spawn state may name

    def machine(self, name: str, machine: dict[str, Any]) -> None:
        path: ConfigPath = ("state_machines", name)
        feeds = self.feeds(path, _list(machine.get("feeds")))
        templates = url_templates(machine)
        for index, rule in enumerate(_list(machine.get("webhooks"))):
            if isinstance(rule, dict) and isinstance(rule.get("match"), str):
                for problem in pattern_problems(rule["match"], templates):
                    self.report((*path, "webhooks", index, "match"), problem)
        self.signing(name, path, machine)
        self.retry((*path, "retry"), machine.get("retry"))
        states = _list(machine.get("states"))
        names = self.state_names(path, states)
        edges: dict[str, set[str]] = {state: set() for state in names}
        dangling = False
        for index, state in enumerate(states):
            if not isinstance(state, dict):
                continue
            state_path = (*path, "states", index)
            name_of_state = _state_name(state)
            if "gate" in state:
                self.gate(state_path, state, feeds)
            elif "action" in state:
                self.url((*state_path, "webhook"), state.get("webhook"))
                self.checked.problems.extend(action_problems(state_path, state, self.source))
                self.retry((*state_path, "retry"), state.get("retry"))
            elif "spawn" in state:
                for where, message in spawn_problems(state_path, state, self.machines):
                    self.report(where, message)
            children = "spawn" in state  # only a spawn's next reads children.*
            next_ = state.get("next")
            for target_path, target in self.next_states(state_path, next_, feeds, children):
                if target not in names:
                    dangling = True
                    known = ", ".join(names) or "none"
                    self.report(
                        target_path,
                        f"no state called {target!r} in state machine {name!r} (states: {known})",
                    )
                elif name_of_state in edges:
                    edges[name_of_state].add(target)
        if not dangling:  # else unreachable states would only echo the unknown destination
            self.connected(path, states, names, edges, also=machine.get("abort_to"))
            for where, message in outcome_problems(path, states, names, edges):
                self.report(where, message)
        problems = migration_problems((*path, "migrations"), machine.get("migrations"), names)
        for where, message in problems + strategy_problems(path, machine, names):
            self.report(where, message)

    def feeds(self, path: ConfigPath, feeds: list[Any]) -> set[str]:
        first: dict[str, int] = {}
        for index, feed in enumerate(feeds):
            if not isinstance(feed, dict):
                continue
            self.url((*path, "feeds", index, "url"), feed.get("url"))
            name = feed.get("name")
            if not isinstance(name, str):
                continue
            if name in first:
                self.report(
                    (*path, "feeds", index, "name"),
                    f"duplicate feed name {name!r} (also feeds.{first[name]})",
                )
            else:
                first[name] = index
        return set(first)

    def url(self, path: ConfigPath, url: Any) -> None:
        if not isinstance(url, str):
            return
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            self.report(path, f"expected an http:// or https:// URL, got {url!r}")

    def signing(self, name: str, path: ConfigPath, machine: dict[str, Any]) -> None:
        variable = machine.get("signing_secret_env")
        if not isinstance(variable, str):
            if isinstance(machine.get("signing_secret"), str):
                self.checked.secrets[name] = machine["signing_secret"]
            return
        if "signing_secret" in machine:
            self.report(
                (*path, "signing_secret_env"),
                "give signing_secret or signing_secret_env, not both",
            )
        elif self.environ.get(variable):
            self.checked.secrets[name] = self.environ[variable]
        else:
            self.report(
                (*path, "signing_secret_env"),
                f"environment variable {variable} (the signing secret) is not set or empty",
            )

    def retry(self, path: ConfigPath, retry: Any) -> None:
        if not isinstance(retry, dict):
            return
        delays = {}
        for key in ("initial_delay", "max_delay", "timeout"):
            text = retry.get(key)
            if not isinstance(text, str):
                continue
            duration = parse_duration(text)
            if duration is None:
                self.report((*path, key), f"expected {_DURATION_HINT}, got {text!r}")
            elif key == "timeout" and not duration:
                self.report((*path, key), "the timeout must be longer than zero")
            else:
                delays[key] = duration
        if delays.get("initial_delay", _NEVER) > delays.get("max_delay", _FOREVER):
            self.report((*path, "initial_delay"), "initial_delay is longer than max_delay")

    def state_names(self, path: ConfigPath, states: list[Any]) -> list[str]:
        names: list[str] = []
        first: dict[str, int] = {}
        for index, state in enumerate(states):
            name = _state_name(state) if isinstance(state, dict) else None
            if name is None:
                continue
            kind = next(key for key in ("gate", "action", "spawn") if key in state)
            name_path = (*path, "states", index, kind)
            if not _STATE_NAME.fullmatch(name):
                self.report(
                    name_path,
                    f"invalid state name {name!r}: use letters, digits and underscores only",
                )
            if name in first:
                self.report(name_path, f"duplicate state name {name!r} (also states.{first[name]})")
            else:
                first[name] = index
            names.append(name)
        return names

    def gate(self, path: ConfigPath, gate: dict[str, Any], feeds: set[str]) -> None:
        for index, trigger in enumerate(_list(gate.get("triggers"))):
            if isinstance(trigger, dict):
                self.trigger((*path, "triggers", index), trigger)
        condition = gate.get("exit_condition")
        if isinstance(condition, bool):
            condition = "true" if condition else "false"
        if isinstance(condition, str):
            self.condition((*path, "exit_condition"), condition, feeds)

    def trigger(self, path: ConfigPath, trigger: dict[str, Any]) -> None:
        value = trigger.get("metadata")
        if isinstance(value, str) and split_path(value) is None:
            self.report(
                (*path, "metadata"),
                f"expected a path in the metadata such as payment.status, got {value!r}",
            )
        value = trigger.get("interval")
        if isinstance(value, str):
            interval = parse_duration(value)
            if interval is None:
                self.report((*path, "interval"), f"expected {_DURATION_HINT}, got {value!r}")
            elif not interval:
                self.report((*path, "interval"), "the interval must be longer than zero")
        value = trigger.get("time")
        if isinstance(value, str) and parse_time_of_day(value) is None:
            self.report(
                (*path, "time"),
                f'expected a time of day such as 18h30m or "18:30", got {value!r}',
            )
        value = trigger.get("timezone")
        if isinstance(value, str):
            self.timezone((*path, "timezone"), value)

    def timezone(self, path: ConfigPath, name: str) -> None:
        if name.startswith("metadata."):
            parts = split_path(name)
            if parts is None:
                self.report(path, f"invalid metadata path {name!r}")
            return
        try:
            zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            self.report(
                path,
                f"unknown time zone {name!r}: expected an IANA name such as Europe/London,"
                " or metadata.PATH to read each label's own zone",
            )

    def condition(self, path: ConfigPath, text: str, feeds: set[str]) -> None:
        try:
            program = compile_condition(text)
        except ConditionSyntaxError as error:
            line, column = self.condition_position(path, text, error.line, error.column)
            source_line = error.source.split("\n")[error.line - 1]
            snippet = source_line[error.column - 1 :][: error.length]
            self.report(
                path,
                f"invalid exit condition: error on line {error.line} of the condition:"
                f" {error.message} (at {snippet!r})",
                line=line,
                column=column,
            )
            return
        self.checked.conditions[path] = program
        for feed in sorted(program.feeds - feeds):
            offset = max(0, text.find(f"feeds.{feed}"))
            line, column = self.condition_position(
                path, text, text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)
            )
            self.report(
                path,
                f"the exit condition reads feeds.{feed} but the state machine has no feed"
                f" called {feed!r} (feeds: {', '.join(sorted(feeds)) or 'none'})",
                line=line,
                column=column,
            )

    def condition_position(
        self, path: ConfigPath, text: str, line: int, column: int
    ) -> tuple[int | None, int | None]:
        """Where ``line``/``column`` of the condition ``text`` at ``path`` is in its file.

        Exact for literal blocks (``|``) and for folded, plain or quoted values
        that fold into one line; otherwise the start of the value.
        """
        scalar = self.source.scalars.get(path)
        if scalar is None:
            return None, None
        if scalar.style == "|":
            return scalar.line + line, self.block_indent(scalar.file, scalar.line) + column
        paragraphs = self.folded_paragraphs(scalar)
        folded = "\n".join(" ".join(piece for _, _, piece in lines) for lines in paragraphs)
        if folded == text.rstrip("\n") and line <= len(paragraphs):
            offset = column - 1
            for segment_line, segment_column, piece in paragraphs[line - 1]:
                if offset <= len(piece):
                    return segment_line, segment_column + offset
                offset -= len(piece) + 1
        return scalar.line, scalar.column

    def folded_paragraphs(self, scalar: ScalarMark) -> list[list[tuple[int, int, str]]]:
        """The source lines a folded value is made of, as (line, column, text).

        Folding joins lines with a space and turns each blank line into a line
        break, so each paragraph here is one line of the value.
        """
        quote = 1 if scalar.style in ("'", '"') else 0
        first = scalar.line + 1 if scalar.style == ">" else scalar.line
        paragraphs: list[list[tuple[int, int, str]]] = [[]]
        for number in range(first, scalar.end_line + 1):
            raw = self.source.source_line(scalar.file, number) or ""
            start = scalar.column - 1 + quote if number == scalar.line else 0
            end = scalar.end_column - 1 - quote if number == scalar.end_line else len(raw)
            piece = raw[start:end]
            if piece.strip():
                start += len(piece) - len(piece.lstrip())
                paragraphs[-1].append((number, start + 1, piece.strip()))
            elif number != scalar.end_line:
                paragraphs.append([])
        while len(paragraphs) > 1 and not paragraphs[-1]:
            paragraphs.pop()  # trailing blank lines: YAML's chomping decides, not folding
        return paragraphs

    def block_indent(self, file: str, header_line: int) -> int:
        """A block scalar's indentation: that of its first non-blank content line."""
        line = header_line + 1
        while (text := self.source.source_line(file, line)) is not None:
            if text.strip():
                return len(text) - len(text.lstrip(" "))
            line += 1
        return 0

    def next_states(
        self, path: ConfigPath, next_: Any, feeds: set[str], children: bool = False
    ) -> list[tuple[ConfigPath, str]]:
        """The destinations named by ``next`` (with their paths), after checking it."""
        path = (*path, "next")
        if isinstance(next_, str):
            return [(path, next_)]
        if not isinstance(next_, dict):
            return []
        if next_.get("type") == "constant" and isinstance(next_.get("state"), str):
            return [((*path, "state"), next_["state"])]
        if next_.get("type") != "context":
            return []
        targets: list[tuple[ConfigPath, str]] = []
        if isinstance(next_.get("path"), str):
            self.context_path((*path, "path"), next_["path"], feeds, children)
        if isinstance(next_.get("default"), str):
            targets.append(((*path, "default"), next_["default"]))
        seen: list[tuple[int, Any]] = []
        for index, destination in enumerate(_list(next_.get("destinations"))):
            if not isinstance(destination, dict):
                continue
            if isinstance(destination.get("state"), str):
                targets.append(((*path, "destinations", index, "state"), destination["state"]))
            if "value" not in destination:
                continue
            value = destination["value"]
            earlier = next((i for i, other in seen if same_value(other, value)), None)
            if earlier is not None:
                self.report(
                    (*path, "destinations", index, "value"),
                    f"duplicate destination value {value!r} (also destinations.{earlier})",
                )
            seen.append((index, value))
        return targets

    def context_path(
        self, path: ConfigPath, text: str, feeds: set[str], children: bool = False
    ) -> None:
        parts = split_path(text)
        if children and parts is not None and parts[0] == "children":
            if len(parts) != 2 or parts[1] not in CHILDREN_COUNTS:
                self.report(
                    path,
                    f"expected children.{', children.'.join(CHILDREN_COUNTS)}, got {text!r}",
                )
        elif parts is None or parts[0] not in CONTEXT_NEXT_ROOTS or len(parts) < 2:
            self.report(
                path,
                f"expected a path starting with {', '.join(CONTEXT_NEXT_ROOTS)}"
                f" (such as metadata.variant), got {text!r}",
            )
        elif parts[0] == "feeds" and parts[1] not in feeds:
            self.report(
                path,
                f"reads feeds.{parts[1]} but the state machine has no feed called {parts[1]!r}"
                f" (feeds: {', '.join(sorted(feeds)) or 'none'})",
            )

    def connected(
        self,
        path: ConfigPath,
        states: list[Any],
        names: list[str],
        edges: dict[str, set[str]],
        also: Any = None,  # abort_to, reached too: older versions' labels are sent there
    ) -> None:
        if not names:
            return
        frontier = [names[0], *([also] if isinstance(also, str) and also in edges else [])]
        reached = set(frontier)
        while frontier:
            for target in edges[frontier.pop()]:
                if target not in reached:
                    reached.add(target)
                    frontier.append(target)
        for index, state in enumerate(states):
            name = _state_name(state) if isinstance(state, dict) else None
            if name is not None and name not in reached:
                self.report(
                    (*path, "states", index),
                    f"state {name!r} cannot be reached from the first state {names[0]!r}",
                )

    def logging_plugins(self, plugins: Any) -> None:
        for index, plugin in enumerate(_list(plugins)):
            dotted_path = plugin.get("class") if isinstance(plugin, dict) else None
            if isinstance(dotted_path, str) and not _PLUGIN_CLASS.fullmatch(dotted_path):
                self.report(
                    ("plugins", "logging", index, "class"),
                    f"expected module.path:ClassName, got {dotted_path!r}",
                )


def _state_name(state: dict[str, Any]) -> str | None:
    name = state.get("gate", state.get("action", state.get("spawn")))
    return name if isinstance(name, str) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
