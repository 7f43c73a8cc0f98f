"""One transaction convention, owned by the service (routemaster/service/transactions.py).

Every service module opens its transactions through it; no public service function is
written only to open a transaction around one store call (a plain read or write is
declared with ``read()`` or ``write()`` instead), but for a few that adapt their arguments.

Run as a script (``python -m tests.service.test_transactions``) it prints the count.
"""

from __future__ import annotations

import ast
import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import routemaster.service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.db import occurrences
from routemaster.service.clock_occurrences import record_occurrence
from routemaster.service.transactions import read, write
from tests.api.conftest import CONFIG_PATH

SERVICE = Path(routemaster.service.__file__).parent
OPENERS = {
    "reading",
    "one_snapshot",
    "writing",
    "one_statement",
    "one_label_write",
    "one_label_read",
}
OPENED_ELSEWHERE = {"begin", "connect", "single_statement", "execution_options"}
MOST_PASS_THROUGHS = 8
NOW = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)


def _opener(item: ast.withitem) -> str | None:
    call = item.context_expr
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
        return call.func.id if call.func.id in OPENERS else None
    return None


def _only_opens_a_transaction(function: ast.FunctionDef) -> bool:
    """Whether the function's body (its docstring aside) is one transaction around one call."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.With) or len(body[0].body) != 1:
        return False
    if not all(_opener(item) for item in body[0].items):
        return False
    inner = body[0].body[0]
    return isinstance(inner, ast.Return | ast.Expr) and isinstance(inner.value, ast.Call)


def pass_throughs() -> tuple[list[str], int]:
    """The public service functions that only open a transaction around one store call, and
    how many public service functions there are."""
    found, public = [], 0
    for path in sorted(SERVICE.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                public += 1
                if _only_opens_a_transaction(node):
                    found.append(f"{path.name}:{node.lineno} {node.name}")
    return found, public


def declared() -> list[str]:
    """The plain store reads and writes made service functions by ``read()``/``write()``."""
    return [
        f"{path.name}:{node.targets[0].id}"
        for path in sorted(SERVICE.glob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in {"read", "write"}
        and isinstance(node.targets[0], ast.Name)
    ]


def test_at_most_a_few_service_functions_only_open_a_transaction() -> None:
    found, public = pass_throughs()
    assert len(found) <= MOST_PASS_THROUGHS, found
    assert public > 50 and len(declared()) >= 10


@pytest.mark.parametrize(
    "path", [p for p in sorted(SERVICE.glob("*.py")) if p.name != "transactions.py"]
)
def test_the_service_opens_its_transactions_through_the_one_convention(path: Path) -> None:
    opened = [
        f"line {node.lineno}: .{node.func.attr}" if isinstance(node.func, ast.Attribute) else ""
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
        in OPENED_ELSEWHERE
    ]
    assert opened == [], f"{path.name} opens a transaction of its own: {opened}"


@pytest.fixture
def app(db_engine: sa.Engine) -> Iterator[App]:
    yield App(config=load_config([CONFIG_PATH]), db=db_engine)


def test_a_declared_write_commits_and_a_declared_read_sees_it(app: App) -> None:
    assert record_occurrence(app, "clock", NOW)
    assert not record_occurrence(app, "clock", NOW)  # committed: the second is not the first
    assert record_occurrence.__doc__ == occurrences.record_occurrence.__doc__


def test_a_declared_write_that_raises_is_rolled_back(app: App) -> None:
    def record_then_fail(conn: sa.Connection, key: str) -> None:
        occurrences.record_occurrence(conn, key, NOW)
        raise RuntimeError("after the write")

    with pytest.raises(RuntimeError):
        write(record_then_fail)(app, "clock")
    assert record_occurrence(app, "clock", NOW)  # the failed one left nothing


def test_a_declared_read_writes_nothing(app: App) -> None:
    def write_in_a_read(conn: sa.Connection) -> bool:
        return occurrences.record_occurrence(conn, "clock", NOW)

    assert read(write_in_a_read)(app)
    assert record_occurrence(app, "clock", NOW)  # the read's transaction was not committed


if __name__ == "__main__":
    found, public = pass_throughs()
    print("\n".join(found))
    print(f"{len(found)} of {public} public service functions only open a transaction around")
    print(f"one store call; {len(declared())} plain reads and writes declared with read()/write()")
