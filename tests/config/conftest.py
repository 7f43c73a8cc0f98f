"""Helpers for configuration tests: write YAML to files, collect the problems it has."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from routemaster.config import ConfigError, ConfigProblem, load_config

Write = Callable[..., Path]
Problems = Callable[..., list[ConfigProblem]]
LineOf = Callable[..., int]


@pytest.fixture
def write(tmp_path: Path) -> Write:
    """``write(text, name="config.yaml")``: the dedented text as a file; its path."""

    def write(text: str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


@pytest.fixture
def problems() -> Problems:
    """``problems(*paths, environ=None)``: the problems loading reports (it must fail)."""

    def problems(*paths: Path, environ: Mapping[str, str] | None = None) -> list[ConfigProblem]:
        with pytest.raises(ConfigError) as raised:
            load_config(paths, environ=environ or {})
        return raised.value.problems

    return problems


@pytest.fixture
def line_of() -> Callable[..., int]:
    """``line_of(path, needle, occurrence=1)``: the 1-based line where ``needle`` occurs."""

    def line_of(path: Path, needle: str, occurrence: int = 1) -> int:
        seen = 0
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if needle in line:
                seen += 1
                if seen == occurrence:
                    return number
        raise AssertionError(f"{needle!r} not in {path}")

    return line_of
