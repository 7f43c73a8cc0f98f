"""The statements read as a catalogue: each variant derived from its base by one named rule,
printed whole so that it can be read and EXPLAINed (routemaster/db/catalogue.py).

Run ``pytest tests/db/test_catalogue.py -s -k print`` to read every statement built from the
catalogue's pieces, and each serialised variant beside its base.
"""

from __future__ import annotations

import ast
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import routemaster
from routemaster.db import catalogue
from routemaster.db.catalogue import EACH_LABEL, ONE_LABEL, TASK_HOLDER, serialised
from routemaster.db.keys import label_key, label_key_arrays, shard_key
from routemaster.db.statements import fetch_all
from tests.db.test_statement_text import STATEMENTS

NOW = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)
DB = Path(routemaster.__file__).parent / "db"
SQL = dict(STATEMENTS)

ONE = {"sm": "m", "name": "n7", "key": label_key("n7"), "shard_key": shard_key("n7")}
SEVERAL = {**label_key_arrays([("m", "n7"), ("m", "n8")]), "now": NOW}

# (variant, base, lock, parameters to EXPLAIN both with)
SERIALISED: list[tuple[str, str, str, dict[str, Any]]] = [
    ("labels._SERIALISED_SELECT_FOR_UPDATE", "labels._SELECT_FOR_UPDATE", ONE_LABEL, ONE),
    (
        "transitions._SERIALISED_MERGE_METADATA",
        "transitions._MERGE_METADATA",
        ONE_LABEL,
        {**ONE, "patch": "{}", "scheduled_states": [], "now": NOW},
    ),
    (
        "transitions._SERIALISED_ERROR_LABELS",
        "transitions._ERROR_LABELS",
        EACH_LABEL,
        {**SEVERAL, "entry_ids": [1, 2], "errors": ["e", "e"]},
    ),
    ("transitions._SERIALISED_RETRY", "transitions._RETRY", EACH_LABEL, SEVERAL),
    (
        "label_claims._SERIALISED_LOCK_ENTRIES",
        "label_claims._LOCK_ENTRIES",
        EACH_LABEL,
        {**SEVERAL, "entries": [1, 2]},
    ),
    (
        "tasks._SERIALISED_END_TASK",
        "tasks._END_TASK",
        TASK_HOLDER,
        {"id": "7.x", "shard_key": 7, "outcome": "completed", "now": NOW},
    ),
]


def _serialised_calls() -> Iterator[str]:
    """Where ``serialised(...)`` is called in the store: ``file:line``."""
    for path in sorted(DB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "serialised"
            ):
                yield f"{path.relative_to(DB)}:{node.lineno}"


def _composed() -> list[str]:
    """The statements built at import time from named pieces (``area.NAME``)."""
    names = []
    for path in sorted(DB.rglob("*.py")):
        area = path.relative_to(DB).parts[0].removesuffix(".py")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.JoinedStr | ast.Call):
                for target in node.targets:
                    if isinstance(target, ast.Name) and f"{area}.{target.id}" in SQL:
                        names.append(f"{area}.{target.id}")
    return names


def test_print_every_composed_statement_whole() -> None:
    composed = _composed()
    assert "label_claims._LOCK_GATES" in composed and "tasks._END_TASK" in composed
    for name in composed:
        print(f"-- {name}{SQL[name]}")
        assert "{" not in SQL[name].replace("'{}'", ""), name


@pytest.mark.parametrize(("variant", "base", "lock", "params"), SERIALISED)
def test_print_each_serialised_variant_beside_its_base(
    variant: str, base: str, lock: str, params: dict[str, Any]
) -> None:
    print(f"-- {base}{SQL[base]}\n-- {variant}{SQL[variant]}")
    assert SQL[variant] == serialised(SQL[base], lock)
    added = [line for line in SQL[variant].split("\n") if line not in SQL[base].split("\n")]
    assert " ".join(" ".join(added).split()) == "AND " + " ".join(lock.split())


def test_every_serialised_variant_is_listed_here() -> None:
    """Each call of the rule is a variant printed and EXPLAINed above (the delete's is inside
    its statement: transitions._DELETE, checked below)."""
    assert len(list(_serialised_calls())) == len(SERIALISED) + 1
    delete = " ".join(SQL["transitions._DELETE"].split())
    marked = " ".join(serialised(SQL["transitions._MARK_DELETED"], ONE_LABEL).split())
    assert marked in delete


def test_the_lock_comes_last_in_the_first_where_before_any_row_is_returned() -> None:
    base = "\n    SELECT a FROM labels\n    WHERE x = 1\n      AND y = 2\n    FOR UPDATE\n    "
    derived = serialised(base, ONE_LABEL)
    assert derived.split("\n")[4] == f"      AND {ONE_LABEL}"
    assert derived.split("\n")[5] == "    FOR UPDATE"


def test_the_shared_pieces_are_what_the_indexes_and_labels_say() -> None:
    assert catalogue.CLAIMABLE == "NOT deleted AND NOT paused AND NOT errored"
    assert " ".join(catalogue.RETURNED.split()) == ", ".join(catalogue.LABEL_COLUMNS)


def _plan(conn: sa.Connection, sql: str, params: dict[str, Any]) -> list[str]:
    """The plan's nodes and the indexes they read, without costs or filters."""
    lines = [row[0] for row in fetch_all(conn, "EXPLAIN (COSTS OFF) " + sql, params)]
    return [line.strip() for line in lines if "->" in line or " on " in line]


@pytest.mark.parametrize(("variant", "base", "lock", "params"), SERIALISED)
def test_a_serialised_variant_is_planned_as_its_base(
    db_engine: sa.Engine, variant: str, base: str, lock: str, params: dict[str, Any]
) -> None:
    with db_engine.connect() as conn:
        plain = _plan(conn, SQL[base], params)
        locked = _plan(conn, SQL[variant], params)
    print(f"-- {base}\n" + "\n".join(plain) + f"\n-- {variant}\n" + "\n".join(locked))
    scans = [line for line in plain if " on labels" in line]
    assert scans and all(line in locked for line in scans), (plain, locked)
