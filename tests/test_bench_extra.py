"""``pip install -e '.[bench]'`` gives ``bench/`` everything it imports.

Every module a script in ``bench/`` imports is the standard library, the
checkout's own (``routemaster``, ``tests``, ``bench/`` itself), or comes from a
distribution ``pyproject.toml`` declares: a dependency or the ``bench`` extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
BENCH = REPOSITORY / "bench"


def _imported(path: Path) -> set[str]:
    """The top-level names of the absolute imports in one file, nested ones included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _distribution(requirement: str) -> str:
    """``psycopg2-binary>=2.9.6`` -> ``psycopg2-binary`` (lower case, ``_`` as ``-``)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[._]+", "-", name[0]).lower()


def test_the_bench_extra_declares_what_bench_imports() -> None:
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    declared = {
        _distribution(requirement)
        for requirement in [*project["dependencies"], *project["optional-dependencies"]["bench"]]
    }
    local = {path.stem for path in BENCH.glob("*.py")} | {"routemaster", "tests"}
    providers = packages_distributions()
    undeclared: dict[str, object] = {}
    for path in sorted(BENCH.glob("*.py")):
        for name in _imported(path) - set(sys.stdlib_module_names) - local:
            given_by = {_distribution(dist) for dist in providers.get(name, [])}
            if not given_by & declared:
                undeclared[f"{path.name}: {name}"] = sorted(given_by) or "not installed"
    assert not undeclared, undeclared
    assert "psutil" in {
        _distribution(requirement) for requirement in project["optional-dependencies"]["bench"]
    }
