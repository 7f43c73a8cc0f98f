"""On Citus, a request naming one label runs on that label's shard alone (SPEC F1).

Each statement a label request runs is explained on the cluster: every
distributed step of its plan is one task (``Task Count: 1``), and every task
that reads or writes a shard goes to one worker, so label requests scale
with the workers. A statement that writes a history row with the label's
change is planned as steps (the label's shard, then the history row through
the coordinator, which evaluates its transaction id): each is one task.

Runs when ``ROUTEMASTER_TEST_CITUS_URL`` names a Citus coordinator, on the session's
database there (tests/citus_cluster.py); skipped otherwise.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.config import load_config
from routemaster.db import labels, transitions
from routemaster.db.history import stamp_versions
from routemaster.db.keys import shard_key
from routemaster.db.nodes import nodes_of
from routemaster.db.plumbing.database import distributed
from routemaster.db.plumbing.migrate import (
    DISTRIBUTED_TABLES,
    REFERENCE_TABLES,
    distribute,
)
from routemaster.db.statements import CITUS_PROLOGUE, PROLOGUE, fetch_value
from routemaster.web import create_app
from tests.api.conftest import CONFIG_PATH
from tests.citus_cluster import Cluster

pytestmark = pytest.mark.citus

LABELS = "/state-machines/user/labels"
NOW = datetime.datetime(2026, 11, 28, 5, 0, tzinfo=datetime.UTC)
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+(\w+)", re.IGNORECASE)
_TASKS = re.compile(r"Task Count: (\d+)")
_NODE = re.compile(r"Node: host=(\S+) port=(\d+)")
_GIVE_XACT = re.compile(
    r"^SELECT set_config\('routemaster\.xact_id', %\(routemaster_xact_id\)s, true\); "
)


@pytest.fixture
def citus_engine(citus_cluster: Cluster) -> sa.Engine:
    """The session's database on the cluster, migrated and distributed (emptied around each
    test)."""
    assert distributed(citus_cluster.engine)
    return citus_cluster.engine


class Recorded:
    """The statements engines run that touch a distributed table, with their parameters and
    the engine that ran each (the coordinator's, or a node's for reads sent there)."""

    def __init__(self, *engines: sa.Engine) -> None:
        self.statements: list[tuple[sa.Engine, str, Any]] = []
        self.sent: list[str] = []  # every statement as sent, without the prologue
        self._engines = engines

    def __enter__(self) -> Recorded:
        for engine in self._engines:
            sa.event.listen(engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        for engine in self._engines:
            sa.event.remove(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        statement = statement.removeprefix(CITUS_PROLOGUE).removeprefix(PROLOGUE)
        statement = statement.removeprefix(CITUS_PROLOGUE.removeprefix(PROLOGUE))
        self.sent.append(statement)
        statement = _GIVE_XACT.sub("", statement)  # a routed write's coordinator transaction id
        tables = {name.lower() for name in _TABLE.findall(statement)}
        if tables & set(DISTRIBUTED_TABLES):
            self.statements.append((conn.engine, statement, params))


def _explained(engine: sa.Engine, statement: str, params: Any) -> str:
    with engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("EXPLAIN " + statement, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
    return plan


def _workers(engine: sa.Engine) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT nodename, nodeport FROM pg_dist_node WHERE shouldhaveshards")
        )
        return {(str(host), str(port)) for host, port in rows}


CREATE = ("POST", f"{LABELS}/alice", {"metadata": {"a": 1}})
PAUSE = ("POST", f"{LABELS}/alice/pause", {"reason": "hold"})

# (what runs first, the request checked, its status)
Request = tuple[str, str, dict[str, Any] | None]
CASES: list[tuple[list[Request], Request, int]] = [
    ([], CREATE, 201),
    ([CREATE], ("GET", f"{LABELS}/alice", None), 200),
    ([CREATE], ("PATCH", f"{LABELS}/alice", {"metadata": {"n": {"x": 1}}}), 200),
    ([CREATE], ("PATCH", f"{LABELS}/alice", {"metadata": {"ready": True}}), 200),  # a move
    ([CREATE], PAUSE, 200),
    ([CREATE, PAUSE], ("POST", f"{LABELS}/alice/resume", {"reason": "go"}), 200),
    ([CREATE], ("GET", f"{LABELS}/alice/history", None), 200),
    ([CREATE], ("POST", f"{LABELS}/alice/move", {"state": "done", "reason": "ops"}), 200),
    ([CREATE], ("GET", f"{LABELS}/alice/explain", None), 200),
    ([CREATE], ("GET", f"{LABELS}/alice/deliveries", None), 200),
    ([CREATE], ("GET", f"{LABELS}/alice/tasks", None), 200),
    ([CREATE], ("DELETE", f"{LABELS}/alice", None), 204),
]


@pytest.mark.parametrize(("before", "request_", "status"), CASES)
def test_a_label_request_runs_on_the_label_shard_alone(
    citus_engine: sa.Engine, before: list[Request], request_: Request, status: int
) -> None:
    app = App(config=load_config([CONFIG_PATH]), db=citus_engine)
    client = create_app(app).test_client()
    for method, path, body in before:
        assert client.open(path, method=method, json=body).status_code < 300
    workers = _workers(citus_engine)
    nodes = nodes_of(citus_engine)
    assert nodes is not None
    on_its_node = nodes.engine_for(shard_key("alice"))  # where reads of alice are sent
    method, path, body = request_
    with Recorded(citus_engine, on_its_node) as recorded:
        answer = client.open(path, method=method, json=body)
    assert answer.status_code == status, answer.get_data(as_text=True)
    assert recorded.statements, "the request read or wrote no label"
    if method == "GET" and path.removeprefix(f"{LABELS}/alice") in ("", "/history", "/deliveries"):
        # a read of one label: on the node holding it, nothing on the coordinator
        assert {engine for engine, _, _ in recorded.statements} == {on_its_node}
    if method in ("POST", "PATCH", "DELETE") and path == f"{LABELS}/alice":
        # a create, an update, a delete: on the node holding it (the coordinator only gives
        # the history rows their transaction id)
        assert {engine for engine, _, _ in recorded.statements} == {on_its_node}
        writing_history = [sql for sql in recorded.sent if "INSERT INTO history" in sql]
        if writing_history:  # the first history row takes the coordinator's transaction id
            assert _GIVE_XACT.search(writing_history[0]), writing_history[0]
    for engine, statement, params in recorded.statements:
        plan = _explained(engine, statement, params)
        counts = [int(count) for count in _TASKS.findall(plan)]
        assert counts and all(count == 1 for count in counts), (statement, plan)
        shards = {node for node in _NODE.findall(plan) if node in workers}
        assert len(shards) == 1, (statement, plan)
        if engine is on_its_node:  # sent to the node holding the shard: it runs it itself
            assert shards == {(str(engine.url.host), str(engine.url.port))}, (statement, plan)


def test_history_rows_carry_the_version_and_the_coordinators_transaction(
    citus_engine: sa.Engine,
) -> None:
    """A trigger on a worker's shard saw no version; a worker's default saw its own xid."""
    stamp_versions(citus_engine, {"user": 7})
    app = App(config=load_config([CONFIG_PATH]), db=citus_engine)
    client = create_app(app).test_client()
    assert client.post(f"{LABELS}/alice", json={"metadata": {}}).status_code == 201
    with citus_engine.begin() as conn:
        coordinator = fetch_value(conn, "SELECT CAST(pg_current_xact_id() AS text)")
        assert transitions.soft_delete(conn, "user", "alice", now=NOW) == "start"
    history = client.get(f"{LABELS}/alice/history").get_json()["history"]
    assert [entry["version"] for entry in history] == [7, 7]
    with citus_engine.connect() as conn:
        written = fetch_value(
            conn,
            "SELECT CAST(xact_id AS text) FROM history"
            " WHERE shard_key = %(shard_key)s AND label = 'alice' AND new_state IS NULL",
            {"shard_key": shard_key("alice")},
        )
    assert written == coordinator


def test_migrating_again_distributes_nothing_more(citus_engine: sa.Engine) -> None:
    assert distribute(citus_engine) == []
    with citus_engine.connect() as conn:
        kinds: dict[str, str] = dict(
            conn.execute(
                sa.text("SELECT CAST(logicalrelid AS text), partmethod FROM pg_dist_partition")
            ).all()
        )
    assert {table: kinds.get(table) for table in DISTRIBUTED_TABLES} == dict.fromkeys(
        DISTRIBUTED_TABLES, "h"
    )
    assert {table: kinds.get(table) for table in REFERENCE_TABLES} == dict.fromkeys(
        REFERENCE_TABLES, "n"
    )
    assert "api_tokens" not in kinds  # small tables no statement joins stay on the coordinator


# Commit records: Citus writes one per worker a transaction prepared on (two-phase commit), on
# the node that committed it (the coordinator, or the node a routed write ran on).
_COMMIT_RECORDS = sa.text(
    "SELECT nodeid, result FROM run_command_on_all_nodes("
    "'SELECT coalesce(string_agg(gid, '','' ORDER BY gid), '''') FROM pg_dist_transaction')"
)

Write = Callable[[FlaskClient, sa.Engine], None]


def _api(method: str, path: str, body: dict[str, Any] | None = None) -> Write:
    def write(client: FlaskClient, engine: sa.Engine) -> None:
        answer = client.open(path, method=method, json=body)
        assert answer.status_code < 300, answer.get_data(as_text=True)

    return write


def _moved(*states: str) -> Write:
    """The worker's write after an action (or gates passed through): alice through ``states``."""

    def write(client: FlaskClient, engine: sa.Engine) -> None:
        with engine.begin() as conn:
            label = labels.lock(conn, "user", "alice")
            assert label is not None
            transitions.write_moves(conn, [labels.Moves(label, states, due_at=None)], now=NOW)

    return write


def _errored(client: FlaskClient, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        label = labels.lock(conn, "user", "alice")
        assert label is not None
        erring = transitions.Erring("user", "alice", label.entry_id, "the hook answered 500")
        assert transitions.become_errored(conn, [erring], now=NOW)


TO_NOTIFY = _moved("review", "notify")
SINGLE_LABEL_WRITES: dict[str, tuple[list[Write], Write]] = {
    "create": ([], _api(*CREATE)),
    "patch": ([_api(*CREATE)], _api("PATCH", f"{LABELS}/alice", {"metadata": {"n": 1}})),
    "move via gate": (
        [_api(*CREATE)],
        _api("PATCH", f"{LABELS}/alice", {"metadata": {"ready": True}}),
    ),
    "move through two states": ([_api(*CREATE)], TO_NOTIFY),
    "action success": ([_api(*CREATE), TO_NOTIFY], _moved("done")),
    "operator move": (
        [_api(*CREATE)],
        _api("POST", f"{LABELS}/alice/move", {"state": "done", "reason": "ops"}),
    ),
    "error": ([_api(*CREATE), TO_NOTIFY], _errored),
    "retry": (
        [_api(*CREATE), TO_NOTIFY, _errored],
        _api("POST", f"{LABELS}/alice/retry", {"reason": "fixed"}),
    ),
    "pause": ([_api(*CREATE)], _api(*PAUSE)),
    "resume": ([_api(*CREATE), _api(*PAUSE)], _api("POST", f"{LABELS}/alice/resume", {})),
    "delete": ([_api(*CREATE)], _api("DELETE", f"{LABELS}/alice")),
}


@pytest.mark.parametrize("case", SINGLE_LABEL_WRITES)
def test_a_single_label_write_commits_in_one_phase(citus_engine: sa.Engine, case: str) -> None:
    """Every write of one label runs on its worker alone and commits there in one phase: no
    commit record (a modifying CTE feeding history from the label's row was run through
    intermediate results on both workers and committed in two phases)."""
    app = App(config=load_config([CONFIG_PATH]), db=citus_engine)
    client = create_app(app).test_client()
    before, write = SINGLE_LABEL_WRITES[case]
    for step in before:
        step(client, citus_engine)
    records = _commit_records(citus_engine)
    write(client, citus_engine)
    added = _commit_records(citus_engine) - records
    assert not added, f"{case}: committed in two phases ({sorted(added)})"


def _commit_records(engine: sa.Engine) -> set[tuple[int, str]]:
    with engine.connect() as conn:
        return {
            (port, gid)
            for port, found in conn.execute(_COMMIT_RECORDS)
            for gid in str(found).split(",")
            if gid
        }


def test_a_call_made_with_a_task_id_runs_on_the_label_shard_alone(
    citus_engine: sa.Engine,
) -> None:
    """A task id begins with its label's shard key, which each statement made with it names
    as a flag (NULL for an id issued before 0017): Citus routes the keyed statement to one
    shard, as it did the keyed twins it replaced."""
    from routemaster.db import label_claims, tasks
    from tests.db.test_statement_text import STATEMENTS

    with citus_engine.begin() as conn:
        assert transitions.insert(conn, "m", "pulled", {}, state="pull", now=NOW, due=True)
    with citus_engine.begin() as conn:
        [task] = label_claims.claim_tasks(
            conn, [("m", "pull", tasks.Lease(30, "fixed", 0))], ids=["t1"], worker="w", now=NOW
        )
    assert task.id.startswith(f"{shard_key('pulled')}.")
    workers = _workers(citus_engine)
    params = {"id": task.id, "shard_key": shard_key("pulled"), "now": NOW, "until": NOW}
    sql = dict(STATEMENTS)
    for name in ("_END_TASK", "_HEARTBEAT", "_ISSUED", "_HOLD_FOR_CALLBACK"):
        plan = _explained(citus_engine, sql[f"tasks.{name}"], {**params, "outcome": "done"})
        counts = [int(count) for count in _TASKS.findall(plan)]
        assert counts and all(count == 1 for count in counts), (name, plan)
        assert len({node for node in _NODE.findall(plan) if node in workers}) == 1, (name, plan)
