"""Load the configuration: YAML files → layered document → checked → compiled model.

Only plain YAML is accepted (a ``SafeLoader`` subclass); anything that would
build Python objects is a problem reported like any other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from routemaster.config.bounds import (
    DepthLimitedComposer,
    expansion_problem,
    read_text,
    reader_problem,
)
from routemaster.config.compiler import compile_config
from routemaster.config.json_schema import describe_value, schema_problems
from routemaster.config.model import Config
from routemaster.config.problems import ConfigError, ConfigProblem
from routemaster.config.source import ConfigPath, Mark, ScalarMark, SourceMap, merge_layers
from routemaster.config.validation import semantic_problems

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_VALUE = "tag:yaml.org,2002:value"
_MERGE = "tag:yaml.org,2002:merge"


class _Loader(DepthLimitedComposer, yaml.SafeLoader):
    """SafeLoader minus YAML 1.1 surprises: ``18:30`` stays text, dates stay text.

    Base-60 numbers and timestamps are dropped so ``time: 18:30`` is the string
    a user meant and every value is JSON-like (metadata is JSON). Nesting is
    limited (:mod:`routemaster.config.bounds`).
    """


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp) for tag, regexp in resolvers if tag not in (_TIMESTAMP, _INT, _FLOAT, _VALUE)
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_config(paths: Sequence[str | Path], *, environ: Mapping[str, str] | None = None) -> Config:
    """Load, layer, check and compile the configuration files, in order.

    ``environ`` (default ``os.environ``) supplies ``signing_secret_env``
    variables. Raises :class:`ConfigError` listing every problem found.
    """
    if not paths:
        raise ConfigError([ConfigProblem("<none>", "", None, None, "no configuration file given")])
    environ = os.environ if environ is None else environ
    layers: list[tuple[Any, SourceMap]] = []
    problems: list[ConfigProblem] = []
    for path in paths:
        data, source, file_problems = read_yaml(path)
        problems.extend(file_problems)
        if file_problems:
            continue
        if data is None:
            continue  # an empty layer changes nothing
        if not isinstance(data, dict):
            problems.append(
                source.problem(
                    (), f"the top level must be a mapping, got {describe_value(data)}", line=1
                )
            )
            continue
        layers.append((data, source))
    if problems:
        raise ConfigError(problems)
    if not layers:
        raise ConfigError(
            [ConfigProblem(str(paths[0]), "", None, None, "the configuration is empty")]
        )
    document, source = merge_layers(layers)
    problems.extend(substitute_placeholders(document, source))
    if problems:
        raise ConfigError(problems)
    problems.extend(schema_problems(document, source))
    checked = semantic_problems(document, source, environ)
    problems.extend(checked.problems)
    if problems:
        raise ConfigError(_in_order(problems, [str(path) for path in paths]))
    return compile_config(document, checked, sources=tuple(str(path) for path in paths))


def read_yaml(path: str | Path) -> tuple[Any, SourceMap, list[ConfigProblem]]:
    """Parse one file safely, with the position of every key, item and scalar."""
    file = str(path)
    source = SourceMap(default_file=file)
    text, unreadable = read_text(path)
    if text is None:
        assert unreadable is not None
        return None, source, [unreadable]
    source.texts[file] = text.splitlines()
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as error:
        return None, source, [reader_problem(file, text, error)]
    try:
        node = loader.get_single_node()
        if node is None:
            return None, source, []
        expands = expansion_problem(file, node)
        if expands is not None:
            return None, source, [expands]
        problems: list[ConfigProblem] = []
        _check_duplicate_keys(node, (), file, problems, set())
        if problems:
            return None, source, problems
        data = loader.construct_document(node)
        _record_positions(node, (), file, source, ())
        problems.extend(_non_json_values(data, (), source))
        if problems:
            return None, source, problems
    except yaml.MarkedYAMLError as error:
        return None, source, [_yaml_problem(file, error)]
    except yaml.reader.ReaderError as error:
        return None, source, [reader_problem(file, text, error)]
    except RecursionError:
        return None, source, [ConfigProblem(file, "", None, None, "the YAML nests too deeply")]
    finally:
        loader.dispose()
    return data, source, []


def _yaml_problem(file: str, error: yaml.MarkedYAMLError) -> ConfigProblem:
    mark = error.problem_mark or error.context_mark
    line = mark.line + 1 if mark else None
    column = mark.column + 1 if mark else None
    problem = error.problem or "invalid YAML"
    tag = re.search(r"constructor for the tag '([^']*)'", problem)
    if tag:
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        message = f"unsupported YAML tag {name}: only plain YAML is accepted"
    else:
        context = f" {error.context}" if error.context else ""
        message = f"invalid YAML: {problem}{context}"
    return ConfigProblem(file, "", line, column, message)


def _key_text(node: yaml.Node) -> str:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else "?"


def _check_duplicate_keys(
    node: yaml.Node, path: ConfigPath, file: str, problems: list[ConfigProblem], seen: set[int]
) -> None:
    """YAML keeps the last of two equal keys silently; a config file should not."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                continue
            key = _key_text(key_node)
            if key in first_seen:
                earlier = first_seen[key].start_mark.line + 1
                problems.append(
                    ConfigProblem(
                        file,
                        ".".join(str(part) for part in (*path, key)),
                        key_node.start_mark.line + 1,
                        key_node.start_mark.column + 1,
                        f"duplicate key {key!r} (first given on line {earlier})",
                    )
                )
            else:
                first_seen[key] = key_node
            _check_duplicate_keys(value_node, (*path, key), file, problems, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_duplicate_keys(item, (*path, index), file, problems, seen)


def _record_positions(
    node: yaml.Node, path: ConfigPath, file: str, source: SourceMap, ancestors: tuple[int, ...]
) -> None:
    if id(node) in ancestors:
        raise yaml.constructor.ConstructorError(
            None, None, "an alias refers to its own ancestor", node.start_mark
        )
    ancestors = (*ancestors, id(node))
    if isinstance(node, yaml.ScalarNode):
        start, end = node.start_mark, node.end_mark
        source.scalars[path] = ScalarMark(
            file, start.line + 1, start.column + 1, node.style, end.line + 1, end.column + 1
        )
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, _key_text(key_node))
            mark = key_node.start_mark
            source.keys[child] = Mark(file, mark.line + 1, mark.column + 1)
            _record_positions(value_node, child, file, source, ancestors)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            mark = item.start_mark
            source.keys[child] = Mark(file, mark.line + 1, mark.column + 1)
            _record_positions(item, child, file, source, ancestors)


def _non_json_values(value: Any, path: ConfigPath, source: SourceMap) -> list[ConfigProblem]:
    """Explicit tags (``!!binary``, ``!!set``, ``!!timestamp``) build what JSON cannot hold."""
    if isinstance(value, dict):
        problems = []
        for key, item in value.items():
            if isinstance(key, str):
                problems.extend(_non_json_values(item, (*path, key), source))
            else:
                problems.append(
                    source.problem((*path, str(key)), f"keys must be text, got {key!r}")
                )
        return problems
    if isinstance(value, list):
        return [
            problem
            for index, item in enumerate(value)
            for problem in _non_json_values(item, (*path, index), source)
        ]
    if value is None or isinstance(value, str | int | float | bool):
        return []
    kind = type(value).__name__
    return [source.problem(path, f"unsupported value of type {kind}: only JSON-like values")]


_PLACEHOLDER = re.compile(r"\{placeholders\.([^{}\s]+)\}")


def substitute_placeholders(document: dict[str, Any], source: SourceMap) -> list[ConfigProblem]:
    """Replace ``{placeholders.NAME}`` in every string, in place.

    A string that is exactly one placeholder takes the placeholder's value
    with its type (so a number stays a number); otherwise the value is
    inserted as text.
    """
    placeholders = document.get("placeholders", {})
    if not isinstance(placeholders, dict):
        return []  # the schema reports it
    problems: list[ConfigProblem] = []

    def substitute(value: Any, path: ConfigPath) -> Any:
        if isinstance(value, dict):
            return {key: substitute(item, (*path, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [substitute(item, (*path, index)) for index, item in enumerate(value)]
        if not isinstance(value, str):
            return value
        whole = _PLACEHOLDER.fullmatch(value)
        if whole and whole.group(1) in placeholders:
            return placeholders[whole.group(1)]

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in placeholders:
                known = ", ".join(sorted(map(str, placeholders))) or "none are defined"
                problems.append(
                    source.problem(path, f"unknown placeholder {name!r} (known: {known})")
                )
                return match.group(0)
            replacement = placeholders[name]
            return replacement if isinstance(replacement, str) else str(replacement)

        return _PLACEHOLDER.sub(replace, value)

    for key in list(document):
        if key != "placeholders":
            document[key] = substitute(document[key], (key,))
    return problems


def _in_order(problems: list[ConfigProblem], files: list[str]) -> list[ConfigProblem]:
    """Problems in file order (as given), then by line; unlocated ones last in their file."""
    return sorted(
        problems,
        key=lambda p: (
            files.index(p.file) if p.file in files else len(files),
            p.line is None,
            p.line or 0,
            p.column or 0,
            p.path,
        ),
    )
