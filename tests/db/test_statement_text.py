"""Every statement of the store is written one way: complete SQL in a named constant,
``%(name)s`` parameters, label columns in one order; and no module borrows another's
private names."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import routemaster
import routemaster.db
from routemaster.db.catalogue import LABEL_COLUMNS
from routemaster.db.labels import Label
from routemaster.db.statements import Prepared

PACKAGE = Path(routemaster.__file__).parent
# A SQLAlchemy ``text()`` bind parameter (``:name``), as opposed to a ``::type`` cast.
COLON_PARAMETER = re.compile(r"(?<![:\w]):[a-z_]+\b")
LABEL_LIST_START = re.compile(r"(labels\.)?state_machine, (labels\.)?name, (labels\.)?metadata,")
SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|NOTIFY|LISTEN|SET|RESET|CREATE|DROP|ANALYZE)\b"
)
# The only statements that are templates rather than complete constants, each with exactly
# one slot, filled by its module and nothing else:
# - a search's condition is compiled at request time from the exit-condition language
#   (routemaster/search/; its values travel as %(w0)s parameters, never in the text), so the
#   statements that run it have one {condition} slot (db/search.with_condition);
# - a search index's name is an identifier, which no parameter can be, so its DDL has one
#   {name} slot, filled only with labels_search_ and hex digits (db/search_indexes._named).
TEMPLATES = {
    "search._PAGE": "{condition}",
    "search._COUNT": "{condition}",
    "bulk._INSERT_ITEMS": "{condition}",
    "search_indexes._CREATE_INDEX": "{name}",
    "search_indexes._DROP_INDEX": "{name}",
    "search_indexes._CREATE_STATISTICS": "{name}",
}


def statements() -> list[tuple[str, str]]:
    """(area.NAME, SQL) for every module-level constant of ``routemaster.db`` holding SQL.

    The area is the module below ``routemaster.db``, or the package (``transitions``,
    ``label_claims``) whose module holds it; the plumbing's statements are not the store's.
    """
    found = []
    for info in pkgutil.walk_packages(routemaster.db.__path__, "routemaster.db."):
        area = info.name.split(".")[2]
        if area == "plumbing":
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            sql = value.sql if isinstance(value, Prepared) else value
            if name.lstrip("_").isupper() and isinstance(sql, str) and SQL_START.match(sql):
                found.append((f"{area}.{name}", sql))
    return found


STATEMENTS = statements()


def test_the_statements_are_found() -> None:
    names = {name for name, _ in STATEMENTS}
    assert {"transitions._INSERT", "label_claims._LEASE", "changes._CHANGES"} <= names
    assert len(STATEMENTS) > 40
    returning_labels = [
        sql for _, sql in STATEMENTS if LABEL_LIST_START.search(" ".join(sql.split()))
    ]
    assert len(returning_labels) >= 12  # insert, select, lock, merge, moves, claims...


@pytest.mark.parametrize(("name", "sql"), STATEMENTS, ids=[name for name, _ in STATEMENTS])
def test_a_statement_has_the_drivers_named_parameters_only(name: str, sql: str) -> None:
    assert not COLON_PARAMETER.search(sql), f"{name} has a :name parameter"
    assert "%s" not in sql, f"{name} has a positional parameter"
    complete = sql.replace(TEMPLATES[name], "", 1) if name in TEMPLATES else sql
    assert "{" not in complete.replace("'{}'", ""), f"{name} looks like an unformatted template"


def test_the_templates_are_statements_with_their_one_slot() -> None:
    found = dict(STATEMENTS)
    assert set(TEMPLATES) <= set(found)
    for name, slot in TEMPLATES.items():
        assert found[name].count(slot) == 1, name


def test_a_label_is_built_from_its_columns_in_that_order() -> None:
    assert tuple(field.name for field in dataclasses.fields(Label)) == LABEL_COLUMNS


@pytest.mark.parametrize(("name", "sql"), STATEMENTS, ids=[name for name, _ in STATEMENTS])
def test_labels_are_returned_with_every_column_in_one_order(name: str, sql: str) -> None:
    flat = " ".join(sql.split())
    whole = ", ".join(LABEL_COLUMNS)
    qualified = ", ".join(f"labels.{column}" for column in LABEL_COLUMNS)
    for start in re.finditer(LABEL_LIST_START, flat):
        if flat[: start.start()].endswith("INSERT INTO labels ("):
            continue  # the columns an INSERT writes
        listed = flat[start.start() :]
        assert listed.startswith(whole) or listed.startswith(qualified), (name, listed[:300])


def test_no_module_imports_anothers_private_names() -> None:
    borrowed = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("routemaster"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.endswith("__"):
                        borrowed.append(f"{path.relative_to(PACKAGE)}: {node.module}.{alias.name}")
    assert borrowed == []


def test_no_statement_is_assembled_at_run_time() -> None:
    """A statement is a module-level constant, complete once its module is imported (named
    pieces of ``routemaster/db/catalogue.py`` put in at import time, printed whole by
    tests/db/test_catalogue.py); never an f-string built while a request runs."""
    assembled = []
    for path in (PACKAGE / "db").rglob("*.py"):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.JoinedStr):
                    text = "".join(
                        str(part.value) for part in node.values if isinstance(part, ast.Constant)
                    )
                    if SQL_START.match(text):
                        assembled.append(f"{path.name}:{node.lineno}")
    assert assembled == []
