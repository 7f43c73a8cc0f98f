"""The language is pure: it imports only the standard library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import routemaster.exit_conditions

PACKAGE = Path(routemaster.exit_conditions.__file__).parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_imports_only_stdlib_and_itself() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith(
                "routemaster.exit_conditions"
            ), f"{path.name} imports {name}"


def test_tokenizer_knows_nothing_of_the_grammar_or_evaluation() -> None:
    internal = {
        name.rsplit(".", 1)[1]
        for name in _imports(PACKAGE / "tokenizer.py")
        if name.startswith("routemaster.")
    }
    assert internal == {"compile_errors"}
