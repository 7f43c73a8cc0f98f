"""Which parts of routemaster may import which: dependencies point inwards.

The pure core (exit conditions, config, machine) knows nothing of the
database, HTTP or Flask; the API and the worker sit on top and never import
each other; nothing imports the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "routemaster"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, *, is_package: bool) -> set[str]:
    """Absolute names of every module ``source`` imports, relative imports resolved.

    ``from a import b`` yields both ``a`` and ``a.b`` (``b`` may be a module).
    """
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def _imports(path: Path) -> set[str]:
    return imports_of(path.read_text(), _module_name(path), is_package=path.name == "__init__.py")


def _area(name: str) -> str | None:
    """``routemaster.config.loader`` -> ``config``; not routemaster's -> None."""
    parts = name.split(".")
    if parts[0] != "routemaster" or len(parts) == 1:
        return None
    area = parts[1].removesuffix(".py")
    return "cli" if area.startswith("cli_") else area  # the command line spans cli*.py


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}

# area -> the other routemaster areas it may import (None: no rule beyond the global ones)
ALLOWED: dict[str, set[str]] = {
    "exit_conditions": set(),
    "config": {"exit_conditions"},
    "machine": {"config", "exit_conditions"},
    "db": {"config", "exit_conditions", "machine"},
    "logging": {"config", "exit_conditions"},
}
FORBIDDEN: dict[str, set[str]] = {
    "http": {"api", "worker", "labels", "db", "cli"},
    "auth": {"api", "worker", "labels", "http", "metrics"},
    "metrics": {"api", "worker", "labels", "http", "auth"},
    "labels": {"api", "worker"},
    "api": {"worker"},
    "worker": {"api"},
}


def _routemaster_areas(module: str) -> set[str]:
    own = _area(module)
    return {
        area
        for name in _imports(MODULES[module])
        if (area := _area(name)) not in {None, own, "__version__"}
    }


def test_the_package_is_found() -> None:
    assert "routemaster.app" in MODULES
    assert "routemaster.db.database" in MODULES


@pytest.mark.parametrize("module", [m for m in MODULES if _area(m) in ALLOWED])
def test_inner_layers_import_only_what_they_may(module: str) -> None:
    area = _area(module)
    assert area is not None
    extra = _routemaster_areas(module) - ALLOWED[area]
    assert not extra, f"{module} imports {sorted(extra)}; {area} may import only {ALLOWED[area]}"


@pytest.mark.parametrize("module", [m for m in MODULES if _area(m) in FORBIDDEN])
def test_outer_layers_do_not_import_each_other(module: str) -> None:
    area = _area(module)
    assert area is not None
    wrong = _routemaster_areas(module) & FORBIDDEN[area]
    assert not wrong, f"{module} imports {sorted(wrong)}"


@pytest.mark.parametrize("module", [m for m in MODULES if _area(m) not in {"cli", "__main__"}])
def test_nothing_imports_the_command_line(module: str) -> None:
    assert "cli" not in _routemaster_areas(module)


@pytest.mark.parametrize("module", [m for m in MODULES if _area(m) not in {"api", "cli"}])
def test_only_the_api_imports_flask(module: str) -> None:
    flask = {name for name in _imports(MODULES[module]) if name.split(".")[0] == "flask"}
    assert not flask, f"{module} imports {sorted(flask)}"


def test_relative_and_from_imports_are_resolved() -> None:
    source = "from ..config import model\nfrom . import queries\nimport flask.json\n"
    assert imports_of(source, "routemaster.db.schema", is_package=False) == {
        "routemaster.config",
        "routemaster.config.model",
        "routemaster.db",
        "routemaster.db.queries",
        "flask.json",
    }
    assert imports_of(
        "from .loader import load_config\n", "routemaster.config", is_package=True
    ) == {"routemaster.config.loader", "routemaster.config.loader.load_config"}
