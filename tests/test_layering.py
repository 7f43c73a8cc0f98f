"""Which parts of routemaster may import which: the whole graph, stated once.

Dependencies point inwards. At the bottom, the exit-condition language and
the configuration that compiles it; then pure planning (``machine``), the
store (``db``) and outbound HTTP (``http``), which know nothing of each
other; the service (``service``) orchestrates them; the per-process socket
hubs (``hubs``) sit beside it; the web core (``webcore``: declarations,
request checks, paging, rendering, errors) sits above it; the three faces
(``api``, ``console`` and ``worker``) sit on top and never import each
other; ``web`` assembles the two web faces into one Flask app; only the
command line builds processes, and nothing imports it. Every import between these areas must be
an edge of :data:`ALLOWED`; an edge that is not is a design change, made by
editing the table (and ``docs/architecture.md``) on purpose.

Also here: only the web faces, the web core, ``web`` and the command line use
Flask; the three faces and the web core never touch the store (no
``routemaster.db``, no ``sqlalchemy``, no connection or transaction of their
own); every SQL
statement lives in ``routemaster/db/``; no module is over 800 lines (a
module is as long as its one idea: the cap only catches one that has become
several).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "routemaster"
MAX_LINES = 800


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
            prefix = _from_module(node, package)
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of ``from ... import``, relative to ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path) -> set[str]:
    return imports_of(path.read_text(), _module_name(path), is_package=path.name == "__init__.py")


def _area(name: str) -> str | None:
    """``routemaster.config.loader`` -> ``config``; not routemaster's -> None.

    ``routemaster/__init__.py`` (which holds ``__version__``) is the area
    ``__init__``. The bare name ``routemaster`` is no area: every import of a
    routemaster module names it (``from routemaster import labels``).
    """
    parts = name.split(".")
    if parts[0] != "routemaster" or len(parts) == 1:
        return None
    return "__init__" if parts[1] == "__version__" else parts[1]


def _area_of_module(module: str) -> str:
    area = "__init__" if module == "routemaster" else _area(module)
    assert area is not None
    return area


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}

BOTTOM = {"exit_conditions", "config", "search"}
BELOW_SERVICE = BOTTOM | {"machine", "db", "http", "logging", "hooks", "app", "limits"}
FACES = {"api", "console"}
# What a web face may use below the service: never the store, nor outbound HTTP.
FACE = BELOW_SERVICE - {"db", "http"} | {"service"}

# area -> every other routemaster area it may import. Nothing else may be imported.
ALLOWED: dict[str, frozenset[str]] = {
    "__init__": frozenset(),  # the version, and nothing else
    "exit_conditions": frozenset(),  # the gate language: pure
    "config": frozenset({"exit_conditions"}),  # YAML -> model; compiles conditions
    "search": frozenset({"exit_conditions"}),  # search expressions -> SQL conditions: pure
    "machine": frozenset({"config", "exit_conditions"}),  # pure planning
    "db": frozenset(),  # the store: rows, names and JSON; knows no machine
    "limits": frozenset(),  # bounded parsing of untrusted JSON
    "http": frozenset({"__init__", "config", "exit_conditions", "limits"}),  # outbound calls
    "logging": frozenset({"config"}),  # logging plugins
    "hooks": frozenset({"config", "logging"}),  # calling the plugins' hooks
    "app": frozenset(
        {"config", "db", "logging", "hooks", "http", "machine", "metrics"}
    ),  # the per-process App (and the per-process state it holds: the stream's horizon)
    "auth": frozenset({"db"}),  # API tokens: secrets, the per-process cache, admin
    # Prometheus metrics and label gauges (labels per version: the machine page's rule)
    "metrics": frozenset({"config", "db", "logging", "machine"}),
    # the service: labels, operator commands, tasks, bulk, configuration changes, receivers,
    # subscriptions, searches and the reads the faces need; store + planner + feeds
    "service": frozenset(BELOW_SERVICE),
    # per-process hubs holding sockets: the changes streams, the claims that wait
    "hubs": frozenset({"app", "db", "service"}),
    # the web core: declarations, request checks, paths, bodies, rendering, errors
    "webcore": frozenset(FACE | {"hubs"}),
    "api": frozenset(FACE | {"__init__", "auth", "metrics", "hubs", "webcore"}),  # JSON face
    "console": frozenset(FACE | {"auth", "webcore"}),  # the HTML face
    "web": frozenset({"api", "console", "webcore", "app", "hubs"}),  # one Flask app, both faces
    # loop, slots, clock: calls the service, and makes the calls its slots send itself
    "worker": frozenset(BELOW_SERVICE - {"db"} | {"service"}),
    "server": frozenset({"hubs", "logging"}),  # gunicorn: application, workers, hand-off
    # the pull workers' client: speaks HTTP to the service, imports nothing of the server side
    "client": frozenset({"__init__"}),
    "cli": frozenset(
        BELOW_SERVICE
        | {"__init__", "service", "api", "web", "worker", "auth", "metrics", "server", "client"}
    ),  # one module per command group; builds every process
    "__main__": frozenset({"cli"}),
}

WEB_FRAMEWORK = {"flask", "werkzeug"}
MAY_USE_THE_WEB_FRAMEWORK = FACES | {"webcore", "web", "cli"}


def _areas_imported(module: str) -> set[str]:
    own = _area_of_module(module)
    return {area for name in _imports(MODULES[module]) if (area := _area(name)) not in {None, own}}


def _area_edges() -> dict[str, set[str]]:
    """The area graph the code has: area -> the other areas its modules import."""
    edges: dict[str, set[str]] = {}
    for module in MODULES:
        edges.setdefault(_area_of_module(module), set()).update(_areas_imported(module))
    return edges


def _find_cycle(graph: Mapping[str, Set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return [*visiting[visiting.index(node) :], node]
        if node in done:
            return None
        visiting.append(node)
        for successor in sorted(graph.get(node, ())):
            if (cycle := visit(successor)) is not None:
                return cycle
        visiting.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if (cycle := visit(node)) is not None:
            return cycle
    return None


def _module_imports(path: Path) -> set[str]:
    """The routemaster modules ``path`` imports, each import resolved to the one module it loads.

    Unlike :func:`imports_of`, ``from routemaster.service.refusals import X``
    counts ``routemaster.service.refusals`` only, not its parent package, and a
    module's own packages are left out, so that a package and its modules
    are not mistaken for a cycle.
    """
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = _from_module(node, package)
            for alias in node.names:
                found.add(full if (full := f"{prefix}.{alias.name}") in MODULES else prefix)
    return {
        name
        for name in found
        if name in MODULES and name != module and not module.startswith(f"{name}.")
    }


def test_the_package_is_found() -> None:
    assert "routemaster.app" in MODULES
    assert "routemaster.db.plumbing.database" in MODULES
    assert "routemaster" in MODULES


def test_every_area_has_a_place_in_the_table() -> None:
    areas = {_area_of_module(module) for module in MODULES}
    assert areas == set(ALLOWED), "a new area needs a row in ALLOWED (and docs/architecture.md)"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_the_areas_its_area_may(module: str) -> None:
    area = _area_of_module(module)
    extra = _areas_imported(module) - ALLOWED[area]
    assert not extra, (
        f"{module} imports {sorted(extra)}; {area} may import only {sorted(ALLOWED[area])}"
    )


def test_the_table_points_inwards() -> None:
    assert _find_cycle(ALLOWED) is None
    assert "worker" not in ALLOWED["api"] and "api" not in ALLOWED["worker"]
    assert [area for area, allowed in ALLOWED.items() if "cli" in allowed] == ["__main__"]
    assert not [area for area, allowed in ALLOWED.items() if "__main__" in allowed]
    for pure in ("exit_conditions", "config", "machine", "search"):
        assert ALLOWED[pure] <= BOTTOM, f"{pure} must stay pure"
    for lower in BELOW_SERVICE:
        assert not ALLOWED[lower] & {"service", "api", "console", "web", "worker", "cli"}, lower
    for face in FACES | {"worker"}:
        assert "db" not in ALLOWED[face], f"{face} must reach the store through the service"
    assert "console" not in ALLOWED["api"], "the API never imports the console"
    for face in ("api", "console", "worker"):
        others = {"api", "console", "worker", "webcore"} - {face}
        if face == "worker":
            assert not ALLOWED[face] & others, "the worker imports no web face"
        else:
            assert "worker" not in ALLOWED[face], f"{face} never imports the worker"
    assert "api" not in ALLOWED["console"], "the console never imports the API"
    assert not ALLOWED["webcore"] & {"api", "console", "web", "worker"}, "the core is no face"


def test_the_areas_have_no_import_cycle() -> None:
    assert _find_cycle(_area_edges()) is None


def test_the_modules_have_no_import_cycle() -> None:
    graph = {module: _module_imports(path) for module, path in MODULES.items()}
    assert _find_cycle(graph) is None


def test_every_allowed_edge_names_a_real_area() -> None:
    for area, allowed in ALLOWED.items():
        assert allowed <= set(ALLOWED), area


@pytest.mark.parametrize(
    "module", [m for m in MODULES if _area_of_module(m) not in MAY_USE_THE_WEB_FRAMEWORK]
)
def test_only_the_web_faces_and_the_command_line_import_flask(module: str) -> None:
    web = {name for name in _imports(MODULES[module]) if name.split(".")[0] in WEB_FRAMEWORK}
    assert not web, f"{module} imports {sorted(web)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_the_size_limit(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{module} has {lines} lines (at most {MAX_LINES}): is it still one idea?"
    )


# --- the web faces never touch the store ------------------------------------------------

STORE_MODULES = ("routemaster.db", "sqlalchemy")
OPENS_A_CONNECTION = {"begin", "connect", "execution_options", "raw_connection"}


def store_use_in(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """What in ``source`` reaches the store: importing it or SQLAlchemy, opening a connection.

    ``X.db.begin()``/``X.db.connect()`` (the App's engine), an isolation level
    or execution options: each is a transaction the service should own.
    """
    found = [
        f"imports {name}"
        for name in sorted(imports_of(source, module, is_package=is_package))
        if any(name == store or name.startswith(f"{store}.") for store in STORE_MODULES)
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in OPENS_A_CONNECTION:
            on_engine = isinstance(node.value, ast.Attribute) and node.value.attr == "db"
            if on_engine or node.attr in {"execution_options", "raw_connection"}:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg == "isolation_level":
            found.append(f"line {node.value.lineno}: isolation_level=")
    return found


@pytest.mark.parametrize(
    "module", [m for m in MODULES if _area_of_module(m) in FACES | {"webcore"}]
)
def test_the_web_faces_never_touch_the_store(module: str) -> None:
    path = MODULES[module]
    found = store_use_in(path.read_text(), module, is_package=path.name == "__init__.py")
    assert not found, f"{module} reaches the store (call a routemaster.service function): {found}"


@pytest.mark.parametrize("module", [m for m in MODULES if _area_of_module(m) == "worker"])
def test_the_worker_never_touches_the_store(module: str) -> None:
    """The worker is a face: it parses a claimed batch or a clock occurrence, calls the
    service, records the outcome; the store and its transactions are the service's."""
    path = MODULES[module]
    found = store_use_in(path.read_text(), module, is_package=path.name == "__init__.py")
    assert not found, f"{module} reaches the store (call a routemaster.service function): {found}"


# --- every SQL statement lives in routemaster/db/ ----------------------------------------

SQL_BUILDERS = {
    "text",
    "select",
    "insert",
    "update",
    "delete",
    "table",
    "Table",
    "column",
    "Column",
    "MetaData",
    "literal_column",
    "func",
    "sql",
    "DDL",
}
SQL_RUNNERS = {"execute", "executemany", "exec_driver_sql", "cursor"}
SQL_IN_TEXT = re.compile(
    r"\b(?:SELECT\s|UPDATE\s|INSERT\s+INTO\b|DELETE\s+FROM\b|TRUNCATE\s|"
    r"(?:CREATE|DROP|ALTER)\s+(?:TABLE|INDEX|DATABASE|FUNCTION)\b|(?:LISTEN|NOTIFY)\s+\w)"
)


def sql_built_in(source: str) -> list[str]:
    """What in ``source`` builds or runs SQL: SQLAlchemy's builders, ``execute``, SQL text.

    A bare string statement (a docstring) is prose, not a statement to run.
    """
    tree = ast.parse(source)
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    aliases = {"sqlalchemy"}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sqlalchemy":
                    aliases.add(alias.asname or alias.name.split(".")[0])
                if alias.name.startswith("sqlalchemy.sql"):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            module = node.module or ""
            for alias in node.names:
                if module.startswith("sqlalchemy.sql") or alias.name in SQL_BUILDERS:
                    found.append(f"line {node.lineno}: from {module} import {alias.name}")
        elif isinstance(node, ast.Attribute):
            on_sqlalchemy = isinstance(node.value, ast.Name) and node.value.id in aliases
            if on_sqlalchemy and node.attr in SQL_BUILDERS:
                found.append(f"line {node.lineno}: sqlalchemy.{node.attr}")
            if node.attr in SQL_RUNNERS:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            sql = id(node) not in prose and SQL_IN_TEXT.search(node.value)
            if sql:
                found.append(f"line {node.lineno}: {node.value.strip()[:60]!r}")
    return found


def _outside_the_store() -> Iterator[str]:
    return (m for m in MODULES if _area_of_module(m) != "db")


@pytest.mark.parametrize("module", sorted(_outside_the_store()))
def test_no_sql_is_built_outside_the_store(module: str) -> None:
    found = sql_built_in(MODULES[module].read_text())
    assert not found, f"{module} builds or runs SQL (it belongs in routemaster/db/): {found}"


def test_the_sql_detector_sees_what_it_must_and_only_that() -> None:
    assert sql_built_in("import sqlalchemy as sa\nQ = sa.text('SELECT 1')\n")
    assert sql_built_in("from sqlalchemy import text\n")
    assert sql_built_in("import sqlalchemy\nq = sqlalchemy.select(t)\n")
    assert sql_built_in("def f(conn):\n    conn.execute(q)\n")
    assert sql_built_in("Q = 'UPDATE labels SET x = 1'\n")
    assert sql_built_in("Q = f'DELETE FROM {table}'\n")
    assert sql_built_in("log('LISTEN routemaster_due')\n")
    assert not sql_built_in('"""Claims use SELECT ... FOR UPDATE SKIP LOCKED."""\n')
    assert not sql_built_in(
        "import sqlalchemy as sa\n"
        "def f(conn: sa.Connection) -> None:\n"
        "    try:\n        pass\n    except sa.exc.SQLAlchemyError:\n        pass\n"
    )
    assert not sql_built_in("message = 'select a state, then update the label'\n")


def test_the_store_is_where_the_sql_is() -> None:
    """The detector is not vacuous: it finds the statements where they belong."""
    assert sql_built_in(MODULES["routemaster.db.labels"].read_text())
    assert sql_built_in(MODULES["routemaster.db.label_claims.deliveries"].read_text())


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


def test_cycles_are_found() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# --- the store's plumbing knows no domain module of the store ---------------------------

# What the plumbing (engines, migrations, the embedded server) may use of the store: how
# statements are run and the per-transaction settings. Nothing about labels, counts or history.
PLUMBING_MAY_IMPORT = {"routemaster.db.statements", "routemaster.db.transaction_settings"}


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("routemaster.db.plumbing")])
def test_the_plumbing_imports_no_domain_module_of_the_store(module: str) -> None:
    store = {
        name
        for name in _module_imports(MODULES[module])
        if name.startswith("routemaster.db") and not name.startswith("routemaster.db.plumbing")
    }
    assert store <= PLUMBING_MAY_IMPORT, f"{module} imports {sorted(store - PLUMBING_MAY_IMPORT)}"
